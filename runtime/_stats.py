"""Publisher counters (a frozen snapshot for callers) and a rate-limited warning logger."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass

__all__ = ["PublisherStats", "RateLimitedLog"]


@dataclass(frozen=True, slots=True)
class PublisherStats:
    """Counters of one publisher at one moment (``publisher.stats``).

    ``published`` counts events accepted into the buffer; each of them ends up
    ``delivered``, ``delivery_failed`` or ``dropped_on_close``, or is still ``buffered``
    (in the buffer or in flight to the broker). Events never accepted are counted in
    ``dropped_full`` (buffer full), ``rejected_oversize`` or ``rejected_invalid``;
    ``waiting`` counts events of the ``"wait"`` policy still waiting for room.
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
