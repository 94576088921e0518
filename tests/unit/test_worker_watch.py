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


def test_a_fetch_is_routed_by_lane_from_each_position_with_its_lag(tmp_path: Any) -> None:
    """``route``: records below a slot's position are re-deliveries, a chunk that begins
    past it is completed by a read-back, repartition copies are stepped apart, a slot not
    held is its owner's, and the input's lag is the end past the new position."""
    w = _worker(tmp_path, _Broker(), partitions=2)
    tp, copies = TopicPartition(w.topics.input, 0), TopicPartition(w.topics.repartition, 0)
    other = TopicPartition(w.topics.input, 1)  # slot 1: not held here
    w.consumer.ends[tp] = 40  # type: ignore[attr-defined]
    read: list[tuple[int, int]] = []

    async def read_back(partition: int, ranges: list[tuple[int, int]]) -> list[InRecord]:
        read.extend(ranges)
        return [InRecord(b"{}", tp.topic, partition, o) for a, b in ranges for o in range(a, b)]

    w.watch.readers[tp.topic].read = read_back  # type: ignore[method-assign]

    def recs(at: TopicPartition, offsets: range) -> list[InRecord]:
        return [InRecord(b"{}", at.topic, at.partition, o) for o in offsets]

    async def go() -> Any:
        await _assign(w, _slot(w, 0))
        w.slots.held[0].positions[tp] = 5
        first = await w.watch.route({tp: recs(tp, range(2, 9)), copies: recs(copies, range(3)),
                                     other: recs(other, range(4))})  # fmt: skip
        w.slots.held[0].positions.update(first[1])
        return first, await w.watch.route({tp: recs(tp, range(12, 15))})

    (steps, after), (steps2, after2) = asyncio.run(go())
    lane = w.slots.lane_of(tp)
    assert [r.offset for r in steps[False][lane]] == [5, 6, 7, 8]  # 2..4 stepped before
    assert [r.offset for r in steps[True][w.slots.lane_of(copies)]] == [0, 1, 2]
    assert after == {tp: 9, copies: 3}  # partition 1 of the input is left to its owner
    assert read == [(9, 12)]  # the second chunk began at 12: 9..11 read back first
    assert [r.offset for r in steps2[False][lane]] == list(range(9, 15)) and after2 == {tp: 15}
    assert w.telemetry.lag == {0: 40 - 15}
    assert w.stats["offsets_read_back"] == 3


def test_a_dropped_chunk_of_the_input_is_not_stepped(tmp_path: Any) -> None:
    w = _worker(tmp_path, _Broker())
    tp, copies = TopicPartition(w.topics.input, 0), TopicPartition(w.topics.repartition, 0)
    chunk = [InRecord(b"{}", tp.topic, 0, o) for o in range(3)]
    copy = [InRecord(b"{}", copies.topic, 0, o) for o in range(3)]
    dropped: list[tuple[str, int]] = []

    def drop(topic: str, partition: int, records: list[Any]) -> bool:
        dropped.append((topic, partition))
        return True

    async def go() -> Any:
        await _assign(w, _slot(w, 0))
        return await w.watch.route({tp: chunk, copies: copy}, drop)

    steps, after = asyncio.run(go())
    assert dropped == [(tp.topic, 0)]  # the seam is asked for input chunks only
    assert steps[False] == {} and after == {copies: 3}
