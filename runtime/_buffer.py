"""The bounded buffer between ``publish()`` and a sink, drained by one background task.

``publish()`` never waits for the sink: it appends to a bounded deque and returns. When
the deque is full the policy decides: ``"drop"`` counts the event in ``dropped_full`` and
logs a rate-limited warning; ``"wait"`` parks it (FIFO, behind earlier waiters) until
room appears or ``deadline`` seconds pass, then drops and counts it. The drain task
starts the sink (retrying with exponential backoff, so a broker that is down never
blocks or fails ``publish()``), hands records over in publish order and yields to the
event loop every few records. Every accepted event gets an index; ``flush()`` waits until
all indexes up to the last one assigned have left the buffer and their deliveries settled.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal, Self

from prism.schemas import MAX_EVENT_BYTES

from ._base import DEFAULT_TOPIC, Publisher, PublishResult, Record
from ._errors import DeliveryFailed, PublisherClosed
from ._sink import Sink, stop_quietly
from ._stats import RateLimitedLog

__all__ = ["BufferedPublisher", "FullPolicy"]

log = logging.getLogger("runtime.publisher")

FullPolicy = Literal["drop", "wait"]
_HAND_OFF_SLICE = 256  # records handed to the sink before yielding to the event loop


@dataclass(slots=True)
class _Entry:
    index: int
    record: Record
    event_id: Any
    deadline: float = 0.0
    waiter: asyncio.Future[bool] | None = field(default=None)


class BufferedPublisher(Publisher):
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
        validate: bool = True,
        raise_errors: bool = False,
        start_backoff: tuple[float, float] = (0.1, 5.0),
    ) -> None:
        super().__init__(
            topic=topic, channel_topic=channel_topic, max_event_bytes=max_event_bytes,
            validate=validate, raise_errors=raise_errors,
        )  # fmt: skip
        if buffer_size < 1:
            raise ValueError(f"buffer_size must be >= 1, got {buffer_size!r}")
        if full_policy not in ("drop", "wait"):
            raise ValueError(f"full_policy must be 'drop' or 'wait', got {full_policy!r}")
        if deadline < 0:
            raise ValueError(f"deadline must be >= 0 seconds, got {deadline!r}")
        self._sink = sink
        self.buffer_size = buffer_size
        self.full_policy: FullPolicy = full_policy
        self.deadline = deadline
        self._backoff_first, self._backoff_max = start_backoff
        self._buffer: deque[_Entry] = deque()
        self._waiting: deque[_Entry] = deque()
        self._sending: _Entry | None = None
        self._inflight: dict[asyncio.Future[Any], _Entry] = {}
        self._next_index = 0
        self._flush_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._expiry: asyncio.TimerHandle | None = None
        self._sink_started = False
        self._closed = False
        self._failures: list[tuple[BaseException, str]] = []
        self._warn_full = RateLimitedLog(log, logging.WARNING)
        self._warn_start = RateLimitedLog(log, logging.WARNING)
        self._log_failure = RateLimitedLog(log, logging.ERROR)

    # -- publishing -----------------------------------------------------------------------
    def publish(self, event: Any) -> PublishResult:
        """Put one event into the buffer and return at once (see ``PublishResult``).

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
        loop = self._loop_or_none()
        if len(self._buffer) < self.buffer_size and not self._waiting:
            self._accept(_Entry(self._next_index, record, wire.get("eventId")))
            self._next_index += 1
            return PublishResult(wire, True)
        if self.full_policy == "wait" and loop is not None and self.deadline > 0:
            entry = _Entry(
                self._next_index, record, wire.get("eventId"),
                deadline=loop.time() + self.deadline, waiter=loop.create_future(),
            )  # fmt: skip
            self._next_index += 1
            self._waiting.append(entry)
            self._counts["waiting"] += 1
            if self._expiry is None:
                self._expiry = loop.call_at(entry.deadline, self._expire_waiting)
            return PublishResult(wire, None, entry.waiter)
        self._drop_full(1)
        return PublishResult(wire, False)

    def _accept(self, entry: _Entry) -> None:
        self._buffer.append(entry)
        self._counts["published"] += 1
        self._counts["buffered"] += 1
        if self._task is None:
            self._ensure_task()
        elif self._wakeup is not None:
            self._wakeup.set()

    def _drop_full(self, n: int) -> None:
        self._counts["dropped_full"] += n
        self._warn_full(
            "event buffer full (%d events, policy %r): dropped %d, %d in total so far; the "
            "broker is down or slower than the agents (see publisher.stats), raise "
            "buffer_size or use full_policy='wait'",
            self.buffer_size, self.full_policy, n, self._counts["dropped_full"],
        )  # fmt: skip

    def _promote(self) -> None:
        """Move waiters whose turn has come into freed buffer room."""
        while self._waiting and len(self._buffer) < self.buffer_size:
            entry = self._waiting.popleft()
            self._counts["waiting"] -= 1
            self._accept(entry)
            if entry.waiter is not None and not entry.waiter.done():
                entry.waiter.set_result(True)

    def _expire_waiting(self) -> None:
        """Drop (and count) waiters past their deadline; re-arm for the next one."""
        self._expiry = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        expired = 0
        while self._waiting and self._waiting[0].deadline <= now:
            entry = self._waiting.popleft()
            self._counts["waiting"] -= 1
            expired += 1
            if entry.waiter is not None and not entry.waiter.done():
                entry.waiter.set_result(False)
        if expired:
            self._drop_full(expired)
            self._notify_flushers()
        if self._waiting:
            self._expiry = loop.call_at(self._waiting[0].deadline, self._expire_waiting)

    # -- the drain task -------------------------------------------------------------------
    def _loop_or_none(self) -> asyncio.AbstractEventLoop | None:
        try:
            return asyncio.get_running_loop()
        except RuntimeError:
            return None

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
        """Start the background task now (``publish()`` also starts it when needed)."""
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
                    "events wait in the buffer meanwhile): %s: %s",
                    self._counts["start_attempts"], delay, type(exc).__name__, exc,
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
            if not self._buffer:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            for _ in range(_HAND_OFF_SLICE):
                if not self._buffer:
                    break
                entry = self._sending = self._buffer.popleft()
                self._promote()
                try:
                    fut = await self._sink.send(entry.record)
                except asyncio.CancelledError:
                    self._buffer.appendleft(entry)  # still ours: close() counts it
                    raise
                except Exception as exc:
                    self._settle(entry, exc)
                    await self._restart_sink()
                else:
                    self._inflight[fut] = entry
                    fut.add_done_callback(self._on_delivery)
                finally:
                    self._sending = None
            self._notify_flushers()
            await asyncio.sleep(0)

    def _on_delivery(self, fut: asyncio.Future[Any]) -> None:
        entry = self._inflight.pop(fut, None)
        if entry is None:
            return
        if fut.cancelled():
            self._settle(entry, asyncio.CancelledError("delivery cancelled"))
        else:
            self._settle(entry, fut.exception())

    def _settle(self, entry: _Entry, error: BaseException | None) -> None:
        self._counts["buffered"] -= 1
        if error is None:
            self._counts["delivered"] += 1
            return
        self._counts["delivery_failed"] += 1
        detail = f"event {entry.event_id!r} (key {entry.record.key.decode(errors='replace')!r})"
        if self.raise_errors:
            self._failures.append((error, detail))
        self._log_failure(
            "could not deliver %s to topic %r: %s: %s (counted in stats.delivery_failed)",
            detail, entry.record.topic or self.topic, type(error).__name__, error,
        )  # fmt: skip

    def _raise_failures(self) -> None:
        if self._failures:
            failures, self._failures = self._failures, []
            raise DeliveryFailed(len(failures), failures[0][0], failures[0][1])

    # -- flush and close ------------------------------------------------------------------
    def _lowest_pending(self) -> int:
        if self._sending is not None:
            return self._sending.index
        if self._buffer:
            return self._buffer[0].index
        if self._waiting:
            return self._waiting[0].index
        return self._next_index

    def _notify_flushers(self) -> None:
        if not self._flush_waiters:
            return
        lowest = self._lowest_pending()
        keep = []
        for target, fut in self._flush_waiters:
            if target < lowest:
                if not fut.done():
                    fut.set_result(None)
            else:
                keep.append((target, fut))
        self._flush_waiters = keep

    async def flush(self, timeout: float | None = None) -> bool:
        """Wait until every event published so far is delivered (or failed or dropped).

        Returns ``True`` when they all settled within ``timeout`` seconds, ``False`` when
        some are still buffered. With ``raise_errors=True`` raises ``DeliveryFailed`` if
        any delivery failed.
        """
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        target = self._next_index - 1
        if self._lowest_pending() <= target:
            self._ensure_task()
            fut: asyncio.Future[None] = loop.create_future()
            self._flush_waiters.append((target, fut))
            try:
                await asyncio.wait_for(asyncio.shield(fut), _remaining(loop, deadline))
            except TimeoutError:
                return False
        pending = [f for f, e in self._inflight.items() if e.index <= target]
        if pending:
            _, not_done = await asyncio.wait(pending, timeout=_remaining(loop, deadline))
            if not_done:
                return False
        self._raise_failures()
        return True

    async def close(self, timeout: float | None = 10.0) -> bool:
        """Flush for up to ``timeout`` seconds, then stop; what is left is ``dropped_on_close``.

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
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        left = len(self._buffer)
        for entry in self._waiting:  # never found room: dropped for a full buffer
            if entry.waiter is not None and not entry.waiter.done():
                entry.waiter.set_result(False)
        if self._waiting:
            self._drop_full(len(self._waiting))
        self._counts["buffered"] -= len(self._buffer)
        self._counts["waiting"] = 0
        self._buffer.clear()
        self._waiting.clear()
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
                self._inflight.pop(fut)
                self._counts["buffered"] -= 1
                left += 1
        self._counts["dropped_on_close"] += left
        for _, fut in self._flush_waiters:
            if not fut.done():
                fut.set_result(None)
        self._flush_waiters.clear()
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


def _remaining(
    loop: asyncio.AbstractEventLoop, deadline: float | None, floor: float = 0.0
) -> float | None:
    if deadline is None:
        return None
    return max(deadline - loop.time(), floor)
