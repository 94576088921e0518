"""The spool side of ``BufferedPublisher``: write-ahead, read-back, acknowledgement, rewind.

With a spool every accepted record is on disk before ``publish()`` returns; the deque
only caches the newest. Records that did not fit in it (and those an earlier process
left) are read back in order (``_refill``). Settled records are acknowledged to the spool
(``_tend_spool``), which frees whole segments. A delivery that failed for a reason that
may pass rewinds to the oldest unsettled record and sends again from disk (``_rewind``):
records already delivered in this process are skipped, so only a crash can double one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import TYPE_CHECKING

from ._pending import Entry, event_id_of
from ._spool import Spool
from ._stats import RateLimitedLog

__all__ = ["Spooling"]

log = logging.getLogger("runtime.publisher")

REFILL = 1024  # records read back from the spool at a time
SPOOL_TICK = 0.2  # seconds between spool acknowledgements and interval fsyncs


class Spooling:
    """Mixin of ``BufferedPublisher`` for its optional spool (see the module)."""

    _spool: Spool | None
    _buffer: deque[Entry]
    _counts: dict[str, int]
    _low: int
    _waiting: deque[Entry]
    _wakeup: asyncio.Event | None
    buffer_size: int
    topic: str

    def _init_spooling(self) -> None:
        self._gen = 0  # bumped by each rewind: failures of older hand-offs are moot
        self._rewind_due = False
        self._disk_from: int | None = None  # first index held only in the spool
        self._acked_at = 0.0  # when the spool was last acknowledged (monotonic)
        self._warn_retry = RateLimitedLog(log, logging.WARNING)
        self._warn_spool = RateLimitedLog(log, logging.ERROR)

    if TYPE_CHECKING:  # provided by Pending and BufferedPublisher

        def _promote(self) -> None: ...
        def _forget(self, start: int, stop: int) -> None: ...
        def _is_settled(self, index: int) -> bool: ...
        async def _restart_sink(self) -> None: ...

    def _spool_take(self, entry: Entry) -> bool:
        """Write ``entry`` to the spool; keep it in the deque too while there is room."""
        assert self._spool is not None
        try:
            if not self._spool.append(entry.index, entry.record):
                if not self._spool.can_free(self._low):
                    return False  # full of undelivered records
                self._spool.ack(self._low)  # then append reclaims what was delivered
                if not self._spool.append(entry.index, entry.record):
                    return False
        except OSError as exc:  # a full or failing disk is a full spool, never a crash
            self._warn_spool(
                "could not write to the spool at %s: %s: %s (treated as a full spool)",
                self._spool.directory, type(exc).__name__, exc,
            )  # fmt: skip
            return False
        self._counts["spooled"] += 1
        self._counts["spool_bytes"] = self._spool.size_bytes
        if self._disk_from is None and len(self._buffer) < self.buffer_size:
            self._buffer.append(entry)
        elif self._disk_from is None:
            self._disk_from = entry.index
        return True

    def _refill(self) -> None:
        """Read the next records that live only in the spool into the (empty) deque."""
        assert self._spool is not None and self._disk_from is not None
        records, after = self._spool.read(self._disk_from, REFILL)
        expected = self._disk_from
        for index, record in records:
            self._forget(expected, index)  # gaps: never written, or lost to corruption
            expected = index + 1
            if not self._is_settled(index):  # not already delivered before a rewind
                self._buffer.append(Entry(index, record, None))
                self._counts["replayed"] += 1
        if after >= self._spool.next_seq:
            self._forget(expected, self._spool.next_seq)
            self._disk_from = None
        else:
            self._disk_from = after

    def _tend_spool(self, *, now: bool = False) -> None:
        """Acknowledge settled records (freeing whole segments) and fsync when due.

        At most every ``SPOOL_TICK`` seconds, unless parked events wait for room.
        """
        spool = self._spool
        if spool is None:
            return
        clock = time.monotonic()
        due = now or self._waiting or clock - self._acked_at >= SPOOL_TICK
        if self._low > spool.acked and due:
            self._acked_at = clock
            try:
                if spool.ack(self._low):
                    self._promote()
            except OSError as exc:
                self._warn_spool("could not acknowledge the spool: %s: %s", type(exc).__name__, exc)
            self._counts["spool_bytes"] = spool.size_bytes
        try:
            spool.sync_if_due()
        except OSError as exc:
            self._warn_spool("could not fsync the spool: %s: %s", type(exc).__name__, exc)

    def _retry_later(self, entry: Entry, exc: BaseException) -> None:
        """A delivery failed for a reason that may pass: send again from the spool."""
        if entry.gen != self._gen or self._rewind_due:
            return  # already rewound past it
        self._rewind_due = True
        self._counts["retried"] += 1
        self._warn_retry(
            "could not deliver event %r to topic %r (%s: %s); it stays in the spool and is "
            "sent again once the broker takes records",
            entry.event_id or event_id_of(entry.record), self.topic, type(exc).__name__, exc,
        )  # fmt: skip
        if self._wakeup is not None:
            self._wakeup.set()

    async def _rewind(self) -> None:
        """Drop the deque, replace the producer, read on from the oldest unsettled record."""
        assert self._spool is not None
        self._rewind_due = False
        self._gen += 1
        self._buffer.clear()
        self._disk_from = self._low if self._low < self._spool.next_seq else None
        await self._restart_sink()

    def _close_spool(self) -> None:
        assert self._spool is not None
        self._tend_spool(now=True)
        left = self._counts["buffered"]
        try:
            self._spool.close()
        except OSError as exc:
            log.error("closing the spool at %s failed: %s", self._spool.directory, exc)
        self._counts["spool_bytes"] = self._spool.size_bytes
        if left:
            log.warning(
                "event publisher closed with %d undelivered event(s) kept in the spool at %s; "
                "the next publisher on that directory sends them",
                left, self._spool.directory,
            )  # fmt: skip
