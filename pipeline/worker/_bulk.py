"""Bulk intake: the input topics' records go to the worker a fetch at a time, not one by one.

faust hands every fetched record to its streams on its own (``Consumer._drain_messages``):
a conductor lookup, an ``Event``, a channel queue, sensors and an ack per record, several
tasks per record in ``wait_first``. At thousands of records per second that alone costs
more than parsing and storing them. ``BulkIntake`` wraps the consumer's
``_wait_next_records`` (the one call every fetch goes through): records of the input
topics are taken out of each fetch and queued as whole partition chunks for the worker;
everything else (table changelogs during recovery, the limit-deaths topic) stays on
faust's path. Only this module and ``_faust`` touch faust internals, pinned by
``tests/unit/test_worker_faust_internals.py``.

What faust's path did per record is done here per chunk:

- **flow control:** records fetched while faust has stopped the flow (a rebalance) are
  dropped, as faust drops them; chunks fetched under an older consumer generation are
  dropped when taken. The worker's read-back (``_offsets``) restores anything a dropped
  chunk leaves missing, so dropping is always safe: with the next records of that
  partition, or, when none follow, once its end has stayed past the worker's position
  with nothing delivered (``Settings.undelivered_read_back_seconds``).
- **backpressure:** at most ``max_pending`` records wait; the fetcher waits for room
  (and gives up the wait when the flow is suspended, dropping the chunk).
- **acknowledgement:** ``_faust.acknowledge`` marks a chunk's offsets processed once the
  ledger has them; faust's own committer then commits them.
- **liveness:** ``_faust.note_inbound`` tells faust's monitor the partition is processed,
  so its slow-stream checks do not misfire.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["BulkIntake", "Chunk"]


@dataclass(slots=True)
class Chunk:
    """The records of one partition from one fetch, in offset order."""

    topic: str
    partition: int
    records: list[Any]  # aiokafka ConsumerRecords
    generation: int


class BulkIntake:
    """Diverts the input topics' records out of faust's per-message path into a queue."""

    def __init__(
        self,
        app: Any,
        topics: Iterable[str],
        *,
        max_pending: int = 20_000,
        drop: Callable[[str, int, list[Any]], bool] | None = None,
    ) -> None:
        self.app = app
        self.topics = frozenset(topics)
        self.max_pending = max_pending
        self.drop = drop  # a test seam: True drops the fetched chunk, as flow control does
        self.pending = 0
        self.dropped = 0
        self._chunks: deque[Chunk] = deque()
        self._ready = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._installed = False

    def install(self) -> None:
        """Wrap the consumer's fetch step (once; faust creates the consumer lazily)."""
        if self._installed:
            return
        consumer = self.app.consumer
        original = consumer._wait_next_records

        async def wait_next_records(timeout: float) -> tuple[Any, Any]:
            records, active = await original(timeout)
            if records:
                await self._divert(consumer, records, active)
            return records, active

        consumer._wait_next_records = wait_next_records
        self._installed = True

    async def _divert(self, consumer: Any, records: dict[Any, list[Any]], active: Any) -> None:
        """Take the input topics' partitions out of ``records`` and queue them."""
        mine = [tp for tp in records if tp.topic in self.topics]
        if not mine:
            return
        taken = {tp: records.pop(tp) for tp in mine}
        if not consumer.flow_active:
            self.dropped += sum(map(len, taken.values()))
            return  # faust seeks back to the committed offsets; read-back covers the rest
        generation = self.app.consumer_generation_id
        buffered = consumer._buffered_partitions
        for tp, recs in taken.items():
            if not recs:
                continue
            if self.drop is not None and self.drop(tp.topic, tp.partition, recs):
                self.dropped += len(recs)
                continue
            if active is not None and tp not in active and tp not in buffered:
                self.dropped += len(recs)
                continue
            while self.pending >= self.max_pending:
                self._room.clear()
                if not await self._wait_room(consumer):
                    self.dropped += len(recs)
                    return
            self._chunks.append(Chunk(tp.topic, tp.partition, recs, generation))
            self.pending += len(recs)
            self._ready.set()

    async def _wait_room(self, consumer: Any) -> bool:
        """Wait until the worker has taken records; False if the flow was suspended."""
        room = asyncio.ensure_future(self._room.wait())
        suspended = asyncio.ensure_future(consumer.suspend_flow.wait())
        try:
            await asyncio.wait({room, suspended}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            room.cancel()
            suspended.cancel()
        return consumer.flow_active

    async def take(self, max_records: int) -> list[Chunk]:
        """The queued chunks (at least one, up to about ``max_records`` records) of the
        current consumer generation; waits while none is queued."""
        while True:
            while not self._chunks:
                self._ready.clear()
                await self._ready.wait()
            passed, out = self._select(max_records)
            for _ in range(passed):  # the chosen chunks, and older generations' among them
                chunk = self._chunks.popleft()
                self.pending -= len(chunk.records)
                if chunk.generation != self.app.consumer_generation_id:
                    self.dropped += len(chunk.records)
            self._room.set()
            if out:
                return out

    def peek(self, max_records: int) -> list[Chunk]:
        """The chunks ``take(max_records)`` would return now, left queued (none: it would
        wait). More may arrive before the take, and join the batch it returns."""
        return self._select(max_records)[1]

    def _select(self, max_records: int) -> tuple[int, list[Chunk]]:
        """How many chunks from the front a take passes, and those of them it returns: the
        current generation's, up to about ``max_records`` records (at least one chunk)."""
        out: list[Chunk] = []
        taken = passed = 0
        generation = self.app.consumer_generation_id
        for chunk in self._chunks:
            if out and taken + len(chunk.records) > max_records:
                break
            passed += 1
            if chunk.generation == generation:
                out.append(chunk)
                taken += len(chunk.records)
        return passed, out

    def waiting(self) -> set[tuple[str, int]]:
        """The (topic, partition) pairs with records queued: about to be stepped."""
        return {(chunk.topic, chunk.partition) for chunk in self._chunks}

    def forget(self, tps: Iterable[tuple[str, int]]) -> int:
        """Drop queued chunks of partitions taken away (a rebalance); how many records."""
        gone = set(tps)
        kept: deque[Chunk] = deque()
        dropped = 0
        for chunk in self._chunks:
            if (chunk.topic, chunk.partition) in gone:
                dropped += len(chunk.records)
            else:
                kept.append(chunk)
        self._chunks = kept
        self.pending -= dropped
        self.dropped += dropped
        self._room.set()
        return dropped
