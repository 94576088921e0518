"""The bounded buffer between ``publish()`` and a sink, drained by one background task.

``publish()`` never waits for the sink. Without a spool it appends to a bounded deque;
with one (``runtime._spool``) it writes the record to disk first and keeps it in the deque
only while there is room, so the deque becomes a cache and the spool's size is the bound.
When there is no room the policy decides: ``"drop"`` counts the event in ``dropped_full``
and logs a rate-limited warning; ``"wait"`` parks it (FIFO, behind earlier waiters) until
room appears or ``deadline`` seconds pass, then drops and counts it. Event types listed in
``never_drop`` are always parked, for ``never_drop_deadline`` seconds.

The drain task starts the sink (retrying with exponential backoff, so a broker that is
down never blocks or fails ``publish()``), hands records over in publish order and yields
to the event loop every few records. With a spool, records that did not fit in the deque
(and those an earlier process left) are read back from disk in order (``replayed``); a
delivery that fails for a reason that may pass (broker gone, timeout) rewinds to the
oldest undelivered record, replaces the producer and sends again from the spool. Every
accepted event gets an index (its spool sequence number); ``flush()`` waits until every
index up to the last one assigned has settled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Collection
from typing import Any, Self

from prism.schemas import MAX_EVENT_BYTES

from ._base import DEFAULT_TOPIC, Publisher, PublishResult
from ._errors import PublisherClosed
from ._pending import Entry, FullPolicy, Pending
from ._sink import Sink, retriable, stop_quietly
from ._spool import Spool
from ._spooling import SPOOL_TICK, Spooling
from ._stats import RateLimitedLog

__all__ = ["BufferedPublisher", "FullPolicy"]

log = logging.getLogger("runtime.publisher")

_HAND_OFF_SLICE = 256  # records handed to the sink before yielding to the event loop


class BufferedPublisher(Spooling, Pending, Publisher):
    """Bounded, never-blocking publisher over any ``Sink`` (base of ``EventPublisher``)."""

    def __init__(
        self,
        sink: Sink,
        *,
        topic: str = DEFAULT_TOPIC,
        channel_topic: str | None = None,
        max_event_bytes: int = MAX_EVENT_BYTES,
        buffer_size: int = 10_000,
        full_policy: FullPolicy = "drop",
        deadline: float = 1.0,
        never_drop: Collection[str] = (),
        never_drop_deadline: float = 30.0,
        spool: Spool | None = None,
        validate: bool = True,
        raise_errors: bool = False,
        start_backoff: tuple[float, float] = (0.1, 5.0),
    ) -> None:
        Publisher.__init__(
            self, topic=topic, channel_topic=channel_topic, max_event_bytes=max_event_bytes,
            validate=validate, raise_errors=raise_errors,
        )  # fmt: skip
        if buffer_size < 1:
            raise ValueError(f"buffer_size must be >= 1, got {buffer_size!r}")
        first = 0 if spool is None else spool.next_seq
        Pending.__init__(
            self, full_policy, deadline, never_drop, never_drop_deadline, first_index=first
        )
        self._sink = sink
        self._spool = spool
        self.buffer_size = buffer_size
        self._backoff_first, self._backoff_max = start_backoff
        self._buffer: deque[Entry] = deque()
        self._inflight: dict[asyncio.Future[Any], Entry] = {}
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._sink_started = False
        self._closed = False
        self._init_spooling()
        self._warn_start = RateLimitedLog(log, logging.WARNING)
        if spool is not None:
            self._low = spool.acked
            if spool.backlog:
                self._disk_from = spool.acked
                self._counts["recovered"] = spool.backlog
                self._counts["buffered"] = spool.backlog
            self._counts["spool_corrupt"] = spool.corrupt
            self._counts["spool_bytes"] = spool.size_bytes

    # -- publishing -----------------------------------------------------------------------
    def publish(self, event: Any) -> PublishResult:
        """Put one event into the buffer (or spool) and return at once (see ``PublishResult``).

        Raises ``EventTooLarge``/``InvalidEvent`` for a bad event, ``PublisherClosed``
        after ``close()``, and (``raise_errors=True`` only) ``DeliveryFailed``. Without a
        running event loop there is nothing to wait on, so a full buffer always drops.
        """
        if self._closed:
            raise PublisherClosed(
                f"publish() called after close() on the publisher for topic {self.topic!r}; "
                "publish before closing, or create a new publisher"
            )
        self._raise_failures()
        wire, record = self.prepare(event)
        return self._offer(wire, record)

    def _take(self, entry: Entry) -> bool:
        """Accept ``entry`` if there is room (memory, or the spool when there is one)."""
        if self._spool is None:
            if len(self._buffer) >= self.buffer_size:
                return False
            self._buffer.append(entry)
        elif not self._spool_take(entry):
            return False
        self._counts["published"] += 1
        self._counts["buffered"] += 1
        if self._task is None:
            self._ensure_task()
        elif self._wakeup is not None:
            self._wakeup.set()
        return True

    def _full_message(self) -> str:
        if self._spool is not None:
            return (
                f"event spool full ({self._spool.size_bytes} of {self._spool.max_bytes} bytes "
                f"at {self._spool.directory})"
            )
        return f"event buffer full ({self.buffer_size} events)"

    # -- the drain task -------------------------------------------------------------------
    def _ensure_task(self) -> None:
        if self._task is None and self._loop_or_none() is not None:
            self._wakeup = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(
                self._drain(), name=f"prism-publisher:{self.topic}"
            )
            self._task.add_done_callback(self._on_task_done)

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:  # a bug, never the broker: log it and restart on next publish
            log.error("the event publisher's drain task failed; restarting", exc_info=exc)
            self._task = None

    async def start(self) -> None:
        """Start the background task now (``publish()`` also starts it when needed).

        With a spool that holds events an earlier process left, call it at startup so they
        are sent at once rather than with the first new event.
        """
        self._ensure_task()

    async def _start_sink(self) -> None:
        delay = self._backoff_first
        while True:
            self._counts["start_attempts"] += 1
            try:
                await self._sink.start()
            except Exception as exc:
                self._warn_start(
                    "could not connect the event publisher (attempt %d, retrying in %.1fs; "
                    "events wait in the %s meanwhile): %s: %s",
                    self._counts["start_attempts"], delay,
                    "buffer" if self._spool is None else "spool", type(exc).__name__, exc,
                )  # fmt: skip
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._backoff_max)
            else:
                self._sink_started = True
                return

    async def _restart_sink(self) -> None:
        """After a failed hand-off the producer may be unusable: replace it."""
        self._sink_started = False
        await stop_quietly(self._sink)
        await self._start_sink()

    async def _drain(self) -> None:
        assert self._wakeup is not None
        if not self._sink_started:
            await self._start_sink()
        while True:
            if self._rewind_due:
                await self._rewind()
            self._tend_spool()
            if not self._buffer and self._disk_from is not None:
                self._refill()
            if not self._buffer:
                self._wakeup.clear()
                if self._spool is None:
                    await self._wakeup.wait()
                else:  # wake now and then to acknowledge deliveries and fsync
                    await _wait(self._wakeup, SPOOL_TICK)
                continue
            for _ in range(_HAND_OFF_SLICE):
                if not self._buffer or self._rewind_due:
                    break
                entry = self._buffer.popleft()
                self._promote()
                entry.gen = self._gen
                try:
                    fut = await self._sink.send(entry.record)
                except asyncio.CancelledError:
                    self._buffer.appendleft(entry)  # still ours: close() counts it
                    raise
                except Exception as exc:
                    if self._spool is not None and retriable(exc):
                        self._retry_later(entry, exc)
                    else:
                        self._settle(entry, exc)
                        await self._restart_sink()
                else:
                    self._inflight[fut] = entry
                    fut.add_done_callback(self._on_delivery)
            self._notify_flushers()
            await asyncio.sleep(0)

    def _on_delivery(self, fut: asyncio.Future[Any]) -> None:
        entry = self._inflight.pop(fut, None)
        if entry is None:
            return
        error = asyncio.CancelledError("delivery cancelled") if fut.cancelled() else fut.exception()
        if error is not None and self._spool is not None and retriable(error):
            self._retry_later(entry, error)
        else:
            self._settle(entry, error)

    # -- flush and close ------------------------------------------------------------------
    async def close(self, timeout: float | None = 10.0) -> bool:
        """Flush for up to ``timeout`` seconds, then stop.

        Without a spool, what is left is counted in ``dropped_on_close``; with one, it stays
        in the spool (still ``buffered``) and the next publisher on that directory sends it.
        Returns ``True`` when everything was delivered (or counted as failed) in time.
        """
        if self._closed:
            return True
        self._closed = True
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        try:
            complete = await self.flush(_remaining(loop, deadline))
        finally:
            await self._shutdown(loop, deadline)
        self._raise_failures()
        return complete

    async def _shutdown(self, loop: asyncio.AbstractEventLoop, deadline: float | None) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._drop_waiting()
        left = len(self._buffer)
        if self._spool is None:
            for entry in self._buffer:
                self._forget(entry.index, entry.index + 1)
            self._counts["buffered"] -= left
        self._buffer.clear()
        if self._sink_started:
            try:
                await asyncio.wait_for(self._sink.stop(), _remaining(loop, deadline, floor=1.0))
            except Exception as exc:  # never let a broken connection crash the caller
                log.warning("stopping the event publisher failed: %s: %s", type(exc).__name__, exc)
        else:
            await stop_quietly(self._sink)
        for fut in list(self._inflight):
            fut.remove_done_callback(self._on_delivery)
            if fut.done():  # settled by the sink's stop, callback not run yet
                self._on_delivery(fut)
            else:
                entry = self._inflight.pop(fut)
                if self._spool is None:
                    self._forget(entry.index, entry.index + 1)
                    self._counts["buffered"] -= 1
                    left += 1
        self._release_flushers()
        if self._spool is not None:
            self._close_spool()
            return
        self._counts["dropped_on_close"] += left
        if left:
            log.warning(
                "event publisher closed with %d undelivered event(s) (stats.dropped_on_close); "
                "the broker was unreachable or close() had too short a timeout",
                left,
            )

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def _wait(event: asyncio.Event, timeout: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout)


def _remaining(
    loop: asyncio.AbstractEventLoop, deadline: float | None, floor: float = 0.0
) -> float | None:
    if deadline is None:
        return None
    return max(deadline - loop.time(), floor)
