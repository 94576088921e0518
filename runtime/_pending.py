"""What the buffered publisher owes its callers: parked events, settled indexes, flush waiters.

Every accepted event has an index; ``_low`` is the lowest index not yet settled (delivered,
failed for good, or never accepted after all), so ``flush()`` is "wait until ``_low``
passes the last index assigned". Events that find no room are parked here (the ``"wait"``
policy, and ``never_drop`` types under any policy) until ``_promote`` finds room for them
or their deadline passes.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from ._base import PublishResult, Record
from ._errors import DeliveryFailed
from ._stats import RateLimitedLog

__all__ = ["Entry", "FullPolicy", "Pending", "event_id_of"]

log = logging.getLogger("runtime.publisher")

FullPolicy = Literal["drop", "wait"]


@dataclass(slots=True)
class Entry:
    """One accepted (or parked) record and what the publisher tracks about it."""

    index: int
    record: Record
    event_id: Any  # None for records read back from the spool (see ``event_id_of``)
    never_drop: bool = False
    deadline: float = 0.0
    waiter: asyncio.Future[bool] | None = field(default=None)
    gen: int = 0  # the rewind generation it was handed to the sink in


def event_id_of(record: Record) -> Any:
    """The ``eventId`` inside a record's value (for log lines), or None."""
    try:
        return orjson.loads(record.value).get("eventId")
    except (orjson.JSONDecodeError, AttributeError):
        return None


class Pending:
    """Mixin of ``BufferedPublisher``: parking, settling and flushing (see the module)."""

    _counts: dict[str, int]
    topic: str
    raise_errors: bool

    def __init__(
        self,
        full_policy: FullPolicy,
        deadline: float,
        never_drop: Collection[str],
        never_drop_deadline: float,
        *,
        first_index: int = 0,
    ) -> None:
        if full_policy not in ("drop", "wait"):
            raise ValueError(f"full_policy must be 'drop' or 'wait', got {full_policy!r}")
        if deadline < 0:
            raise ValueError(f"deadline must be >= 0 seconds, got {deadline!r}")
        if never_drop_deadline < 0:
            raise ValueError(
                f"never_drop_deadline must be >= 0 seconds, got {never_drop_deadline!r}"
            )
        if isinstance(never_drop, str):
            raise ValueError(
                f"never_drop must be a collection of event types, got the string {never_drop!r}; "
                "write never_drop={'usage_recorded'}"
            )
        self.full_policy: FullPolicy = full_policy
        self.deadline = deadline
        self.never_drop = frozenset(never_drop)
        self.never_drop_deadline = never_drop_deadline
        self._next_index = first_index
        self._low = first_index  # every index below it has settled
        self._ahead: set[int] = set()  # settled indexes above _low
        self._waiting: deque[Entry] = deque()
        self._expiry: asyncio.TimerHandle | None = None
        self._flush_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._failures: list[tuple[BaseException, str]] = []
        self._warn_full = RateLimitedLog(log, logging.WARNING)
        self._warn_never = RateLimitedLog(log, logging.ERROR)
        self._log_failure = RateLimitedLog(log, logging.ERROR)

    # provided by the publisher
    def _take(self, entry: Entry) -> bool:
        raise NotImplementedError

    def _ensure_task(self) -> None:
        raise NotImplementedError

    def _full_message(self) -> str:
        raise NotImplementedError

    @staticmethod
    def _loop_or_none() -> asyncio.AbstractEventLoop | None:
        try:
            return asyncio.get_running_loop()
        except RuntimeError:
            return None

    # -- offering and parking -------------------------------------------------------------
    def _offer(self, wire: Mapping[str, Any], record: Record) -> PublishResult:
        never = wire.get("type") in self.never_drop
        entry = Entry(self._next_index, record, wire.get("eventId"), never_drop=never)
        if not self._waiting and self._take(entry):
            self._next_index += 1
            return PublishResult(wire, True)
        loop = self._loop_or_none()
        wait = self.never_drop_deadline if never else self.deadline
        if loop is not None and wait > 0 and (never or self.full_policy == "wait"):
            entry.deadline = loop.time() + wait
            entry.waiter = loop.create_future()
            self._next_index += 1
            self._waiting.append(entry)
            self._counts["waiting"] += 1
            if self._expiry is None or self._expiry.when() > entry.deadline:
                if self._expiry is not None:
                    self._expiry.cancel()
                self._expiry = loop.call_at(entry.deadline, self._expire_waiting)
            return PublishResult(wire, None, entry.waiter)
        self._count_drops([entry])
        return PublishResult(wire, False)

    def _promote(self) -> None:
        """Move waiters whose turn has come into freed room, in publish order."""
        while self._waiting and self._take(self._waiting[0]):
            entry = self._waiting.popleft()
            self._counts["waiting"] -= 1
            if entry.waiter is not None and not entry.waiter.done():
                entry.waiter.set_result(True)

    def _expire_waiting(self) -> None:
        """Drop (and count) waiters past their deadline; re-arm for the next one."""
        self._expiry = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        expired = [e for e in self._waiting if e.deadline <= now]
        if expired:
            self._waiting = deque(e for e in self._waiting if e.deadline > now)
            self._give_up(expired)
        if self._waiting:
            at = min(e.deadline for e in self._waiting)
            self._expiry = loop.call_at(at, self._expire_waiting)

    def _drop_waiting(self) -> None:
        """At close: every parked event is dropped and counted."""
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        waiting, self._waiting = list(self._waiting), deque()
        self._give_up(waiting)

    def _give_up(self, entries: list[Entry]) -> None:
        for entry in entries:
            self._counts["waiting"] -= 1
            self._forget(entry.index, entry.index + 1)
            if entry.waiter is not None and not entry.waiter.done():
                entry.waiter.set_result(False)
        self._count_drops(entries)

    def _count_drops(self, entries: list[Entry]) -> None:
        never = [e for e in entries if e.never_drop]
        normal = len(entries) - len(never)
        if normal:
            self._counts["dropped_full"] += normal
            self._warn_full(
                "%s, policy %r: dropped %d, %d in total so far; the broker is down or slower "
                "than the agents (see publisher.stats), raise the buffer or spool size or use "
                "full_policy='wait'",
                self._full_message(), self.full_policy, normal, self._counts["dropped_full"],
            )  # fmt: skip
        if never:
            self._counts["dropped_never_drop"] += len(never)
            self._warn_never(
                "%s: dropped %d never-drop event(s) (first %r) after waiting up to %.1fs for "
                "room, %d in total so far; these are lost unless re-sent: raise the spool size",
                self._full_message(), len(never), never[0].event_id, self.never_drop_deadline,
                self._counts["dropped_never_drop"],
            )  # fmt: skip

    # -- settling -------------------------------------------------------------------------
    def _is_settled(self, index: int) -> bool:
        return index < self._low or index in self._ahead

    def _forget(self, start: int, stop: int) -> None:
        """Indexes ``start`` to ``stop - 1`` need no delivery (dropped, never written)."""
        if start <= self._low < stop:
            self._low = stop
            self._absorb()
            start = stop
        for index in range(max(start, self._low), stop):
            self._ahead.add(index)

    def _absorb(self) -> None:
        while self._low in self._ahead:
            self._ahead.remove(self._low)
            self._low += 1
        self._notify_flushers()

    def _settle(self, entry: Entry, error: BaseException | None) -> None:
        """Count one record's outcome, once (a record sent twice settles on its first)."""
        if self._is_settled(entry.index):
            return
        if entry.index == self._low:
            self._low += 1
            self._absorb()
        else:
            self._ahead.add(entry.index)
        self._counts["buffered"] -= 1
        if error is None:
            self._counts["delivered"] += 1
            return
        self._counts["delivery_failed"] += 1
        event_id = entry.event_id if entry.event_id is not None else event_id_of(entry.record)
        detail = f"event {event_id!r} (key {entry.record.key.decode(errors='replace')!r})"
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

    # -- flushing -------------------------------------------------------------------------
    def _notify_flushers(self) -> None:
        if not self._flush_waiters:
            return
        keep = []
        for target, fut in self._flush_waiters:
            if target < self._low:
                if not fut.done():
                    fut.set_result(None)
            else:
                keep.append((target, fut))
        self._flush_waiters = keep

    def _release_flushers(self) -> None:
        for _, fut in self._flush_waiters:
            if not fut.done():
                fut.set_result(None)
        self._flush_waiters.clear()

    async def flush(self, timeout: float | None = None) -> bool:
        """Wait until every event published so far is delivered (or failed or dropped).

        Returns ``True`` when they all settled within ``timeout`` seconds, ``False`` when
        some are still buffered. With ``raise_errors=True`` raises ``DeliveryFailed`` if
        any delivery failed. With a spool, events an earlier process left count too.
        """
        target = self._next_index - 1
        if self._low <= target:
            self._ensure_task()
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._flush_waiters.append((target, fut))
            try:
                await asyncio.wait_for(asyncio.shield(fut), timeout)
            except TimeoutError:
                return False
        self._raise_failures()
        return True
