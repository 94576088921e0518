"""Offset continuity: never let the consumer skip a record of the input topic.

faust can abandon a record it was handing to a stream when a rebalance suspends the flow,
and it registers any jump in offsets as a "gap" it may commit past; a stale read offset
after a rebalance can also make it drop a whole range. On the input topic every offset is
a record (idempotent producers, no transactions, no compaction), so a jump is a loss.

The worker keeps, per partition, the next offset it has processed (persisted with the
partition's run state); ``ReadBack.fill`` computes the ranges a batch is missing
(``missing_ranges``) and reads them back from Kafka before the batch is processed, so
they are in the ledger before the batch is acknowledged. The worker then tells faust the
offsets were processed (``_faust.acknowledge``), or its commits would stop before them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from ..core import InRecord
from ._faust import in_record

__all__ = ["ReadBack", "missing_ranges"]


def missing_ranges(expected: int | None, offsets: Iterable[int]) -> list[tuple[int, int]]:
    """Half-open ranges ``[start, end)`` absent between ``expected`` and the batch's offsets.

    ``expected`` is the next offset already processed (None: nothing known yet, so only
    holes inside the batch count). Offsets below ``expected`` are re-deliveries.
    """
    ranges = []
    ordered = sorted(set(offsets))
    cursor = expected if expected is not None else (ordered[0] if ordered else 0)
    for off in ordered:
        if off > cursor:
            ranges.append((cursor, off))
        cursor = max(cursor, off + 1)
    return ranges


class ReadBack:
    """A group-less aiokafka consumer that reads given offset ranges of the input topic."""

    def __init__(self, topic: str, consumer_kwargs: dict[str, Any], timeout_s: float = 30.0):
        self.topic = topic
        self.kwargs = consumer_kwargs
        self.timeout_s = timeout_s
        self._consumer: Any = None

    async def _started(self) -> Any:
        from aiokafka import AIOKafkaConsumer

        if self._consumer is None:
            self._consumer = AIOKafkaConsumer(
                group_id=None,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                **self.kwargs,
            )
            await self._consumer.start()
        return self._consumer

    async def log_start(self, partition: int) -> int:
        """The partition's first offset still in the log (where ``earliest`` starts)."""
        from aiokafka import TopicPartition

        tp = TopicPartition(self.topic, partition)
        starts = await (await self._started()).beginning_offsets([tp])
        return int(starts[tp])

    async def expected(self, partition: int, processed: int | None, committed: int | None) -> int:
        """The next offset the partition must deliver: ``processed`` (the worker's
        position), else ``committed`` (the group's), else the log's first offset."""
        if processed is not None:
            return processed
        return committed if committed is not None else await self.log_start(partition)

    async def fill(
        self, partition: int, processed: int | None, committed: int | None, recs: list[InRecord]
    ) -> tuple[list[InRecord], list[tuple[int, int]]]:
        """``recs`` plus the records of every offset missing before them, in offset order.

        The next offset expected is ``processed`` (the worker's position, kept with the
        partition's state); for a partition with no state, ``committed`` (the group's),
        and with none committed either, the log's first offset. faust can start a freshly
        assigned partition past any of them (records fetched before a rebalance are
        dropped and not fetched again), so none is taken from the first delivery.
        Returns the records and the half-open ranges read back.
        """
        expected = await self.expected(partition, processed, committed)
        gaps = missing_ranges(expected, (r.offset for r in recs))
        if not gaps:
            return recs, []
        merged = {r.offset: r for r in await self.read(partition, gaps)}
        merged.update((r.offset, r) for r in recs)
        return [merged[o] for o in sorted(merged)], gaps

    async def read(self, partition: int, ranges: list[tuple[int, int]]) -> list[InRecord]:
        from aiokafka import TopicPartition

        c = await self._started()
        tp = TopicPartition(self.topic, partition)
        c.assign([tp])
        out: list[InRecord] = []
        loop = asyncio.get_running_loop()
        for start, end in ranges:
            c.seek(tp, start)
            deadline = loop.time() + self.timeout_s
            while await c.position(tp) < end:
                if loop.time() > deadline:
                    raise RuntimeError(
                        f"could not read back offsets {start}..{end - 1} of {self.topic}"
                        f"[{partition}] within {self.timeout_s:.0f}s; the batch is not acknowledged"
                    )
                fetched = await c.getmany(tp, timeout_ms=1000, max_records=10_000)
                out += [in_record(r) for r in fetched.get(tp, []) if start <= r.offset < end]
        return out

    async def close(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None
