"""Publisher counters (a frozen snapshot for callers) and a rate-limited warning logger."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass

__all__ = ["PublisherStats", "RateLimitedLog"]


@dataclass(frozen=True, slots=True)
class PublisherStats:
    """Counters of one publisher at one moment (``publisher.stats``).

    ``published`` counts events accepted into the buffer (or spool); each of them ends up
    ``delivered``, ``delivery_failed`` or ``dropped_on_close``, or is still ``buffered``
    (in the buffer, the spool, or in flight to the broker). Events never accepted are
    counted in ``dropped_full`` (no room: the buffer, or with a spool the spool, is full),
    ``dropped_never_drop`` (a ``never_drop`` type that found no room before its deadline),
    ``rejected_oversize`` or ``rejected_invalid``; ``waiting`` counts parked events still
    waiting for room.

    With a spool: ``spooled`` counts events written to it (every accepted one),
    ``recovered`` the undelivered events an earlier process left in it (they start out
    ``buffered``: ``published + recovered = delivered + delivery_failed + buffered``),
    ``replayed`` records read back from disk and handed to the broker (an earlier
    process's, those that overflowed the in-memory buffer, and re-sends), ``retried``
    the rewinds after a delivery failed for a passing reason (its records are sent again
    from the spool, never counted as failed), ``spool_corrupt`` the torn or damaged
    segment tails skipped, and ``spool_bytes`` the spool's size on disk now.
    """

    published: int = 0
    delivered: int = 0
    dropped_full: int = 0
    rejected_oversize: int = 0
    rejected_invalid: int = 0
    delivery_failed: int = 0
    dropped_on_close: int = 0
    buffered: int = 0
    waiting: int = 0
    start_attempts: int = 0
    dropped_never_drop: int = 0
    spooled: int = 0
    recovered: int = 0
    replayed: int = 0
    retried: int = 0
    spool_corrupt: int = 0
    spool_bytes: int = 0

    def as_dict(self) -> dict[str, int]:
        """The counters as a plain dict (for logs and metrics)."""
        return asdict(self)


class RateLimitedLog:
    """Logs the first occurrence of a condition at once, then at most once per ``interval``.

    Occurrences in between are counted and reported with the next message, so a storm of
    drops costs one log line per interval, never one per event.
    """

    def __init__(self, logger: logging.Logger, level: int, interval: float = 10.0) -> None:
        self._logger = logger
        self._level = level
        self._interval = interval
        self._last: float | None = None
        self._suppressed = 0

    def __call__(self, msg: str, *args: object) -> None:
        now = time.monotonic()
        if self._last is not None and now - self._last < self._interval:
            self._suppressed += 1
            return
        if self._suppressed:
            msg += " (%d similar message(s) suppressed in the last %.0fs)"
            args = (*args, self._suppressed, now - self._last if self._last else 0.0)
        self._logger.log(self._level, msg, *args)
        self._last = now
        self._suppressed = 0
