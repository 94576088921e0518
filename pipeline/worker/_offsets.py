"""Reading given offset ranges of a slot topic back, beside the group's consumer.

The worker steps every offset of a partition from its position on (``_slots``). Should a
fetch ever begin past that position (a fetch dropped before it was stepped: the
``drop_fetched`` seam of the tests plays one), ``ReadBack.read`` reads the offsets in
between with a group-less consumer, read committed, before the batch is stepped, so they
are in the ledger before the batch's offsets are committed. Offsets that hold no record
(transaction markers on the repartition topics) are simply absent from what it returns.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..core import InRecord
from ._records import in_record

__all__ = ["ReadBack"]


class ReadBack:
    """A group-less aiokafka consumer that reads given offset ranges of one topic."""

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
                isolation_level="read_committed",
                **self.kwargs,
            )
            await self._consumer.start()
        return self._consumer

    async def read(self, partition: int, ranges: list[tuple[int, int]]) -> list[InRecord]:
        """The records at the half-open offset ``ranges`` of ``partition``, in order."""
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
                        f"[{partition}] within {self.timeout_s:.0f}s; the batch is not committed"
                    )
                fetched = await c.getmany(tp, timeout_ms=1000, max_records=10_000)
                out += [in_record(r) for r in fetched.get(tp, []) if start <= r.offset < end]
        return out

    async def close(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None
