"""``PartitionWatch.undelivered``: records the consumer handed out and nobody stepped.

When a fetch is dropped before it is stepped and no later record of its partition comes
to show the gap, the only sign is the consumer's position standing past the worker's.
The watch reads those offsets back once that has lasted ``undelivered_read_back_seconds``
(on the input topics only: the repartition topics' gaps are transaction markers).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiokafka import TopicPartition

from prism.pipeline.core import InRecord
from prism.pipeline.settings import Settings
from tests.unit.test_worker_app import _assign, _Broker, _slot, _worker


def test_a_position_left_past_the_workers_is_read_back_after_the_wait(tmp_path: Any) -> None:
    broker = _Broker()
    w = _worker(tmp_path, broker)
    w.settings = Settings(state_dir=tmp_path / "a", partitions=1, undelivered_read_back_seconds=0.2)
    w.watch.settings = w.settings
    tp = TopicPartition(w.topics.input, 0)
    copies = TopicPartition(w.topics.repartition, 0)
    handed_out = {tp: 30, copies: 7}  # the consumer's positions: 0..29 handed out, none stepped

    read: list[tuple[str, list[tuple[int, int]]]] = []

    def reader(topic: str) -> Any:
        async def read_back(partition: int, ranges: list[tuple[int, int]]) -> list[InRecord]:
            read.append((topic, ranges))
            return [InRecord(b"{}", topic, partition, o) for a, b in ranges for o in range(a, b)]

        return read_back

    for topic, rb in w.watch.readers.items():
        rb.read = reader(topic)  # type: ignore[method-assign]

    async def go() -> tuple[dict[Any, Any], dict[Any, Any]]:
        await _assign(w, _slot(w, 0))
        first = await w.watch.undelivered(handed_out)  # seen now; not yet for long enough
        time.sleep(0.25)
        return first, await w.watch.undelivered(handed_out)

    first, then = asyncio.run(go())
    assert first == {}
    assert list(then) == [tp]  # the input only: a repartition gap is markers
    assert [r.offset for r in then[tp]] == list(range(30))
    assert read == [(w.topics.input, [(0, 30)])]
    assert w.stats["offsets_read_undelivered"] == 30


def test_nothing_is_read_back_when_the_wait_is_zero(tmp_path: Any) -> None:
    w = _worker(tmp_path, _Broker())
    assert w.settings.undelivered_read_back_seconds == 0

    async def go() -> dict[Any, Any]:
        await _assign(w, _slot(w, 0))
        return await w.watch.undelivered({TopicPartition(w.topics.input, 0): 30})

    assert asyncio.run(go()) == {}
