"""The bulk intake takes the input topics out of each fetch and hands them over in order."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from faust.types import TP

from prism.pipeline.worker._bulk import BulkIntake

INPUT, CHANNELS, CHANGELOG = "t.agent-events", "t.channel-operations", "g-run-state-changelog"


class _Consumer:
    """The part of faust's Consumer the bulk intake touches, fed with canned fetches."""

    def __init__(self, fetches: list[dict[Any, list[Any]]]) -> None:
        self.fetches = fetches
        self.flow_active = True
        self.suspend_flow = asyncio.Event()
        self._buffered_partitions: set[Any] = set()
        self.active: set[Any] | None = None
        self.passed_on: list[dict[Any, list[Any]]] = []

    async def _wait_next_records(self, timeout: float) -> tuple[Any, Any]:
        records = self.fetches.pop(0) if self.fetches else {}
        return records, self.active


def _recs(first: int, n: int) -> list[Any]:
    return [SimpleNamespace(offset=o) for o in range(first, first + n)]


def _bulk(consumer: _Consumer, **kw: Any) -> tuple[BulkIntake, Any]:
    app = SimpleNamespace(consumer=consumer, consumer_generation_id=1)
    bulk = BulkIntake(app, (INPUT, CHANNELS), **kw)
    bulk.install()
    return bulk, app


def test_input_partitions_are_taken_out_and_everything_else_passes_through() -> None:
    fetch = {TP(INPUT, 0): _recs(0, 3), TP(CHANGELOG, 0): _recs(0, 2), TP(CHANNELS, 1): _recs(5, 1)}
    consumer = _Consumer([fetch])
    bulk, _ = _bulk(consumer)

    async def go() -> Any:
        records, _ = await consumer._wait_next_records(1.0)
        return records, await bulk.take(100)

    left, chunks = asyncio.run(go())
    assert list(left) == [TP(CHANGELOG, 0)]  # faust's path keeps the changelog
    assert [(c.topic, c.partition, [r.offset for r in c.records]) for c in chunks] == [
        (INPUT, 0, [0, 1, 2]),
        (CHANNELS, 1, [5]),
    ]
    assert bulk.pending == 0


def test_take_keeps_fetch_order_and_stops_near_max_records() -> None:
    consumer = _Consumer([{TP(INPUT, 0): _recs(0, 4)}, {TP(INPUT, 0): _recs(4, 4)}])
    bulk, _ = _bulk(consumer)

    async def go() -> list[list[int]]:
        await consumer._wait_next_records(1.0)
        await consumer._wait_next_records(1.0)
        first = await bulk.take(5)  # the first chunk, not the second: 8 > 5
        second = await bulk.take(5)
        return [[r.offset for c in taken for r in c.records] for taken in (first, second)]

    assert asyncio.run(go()) == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_records_of_a_stopped_flow_an_inactive_partition_or_an_old_generation_are_dropped() -> None:
    consumer = _Consumer([{TP(INPUT, 0): _recs(0, 2)}, {TP(INPUT, 1): _recs(0, 3)}])
    bulk, app = _bulk(consumer)

    async def go() -> list[Any]:
        consumer.flow_active = False  # a rebalance began: faust seeks back, so do we
        await consumer._wait_next_records(1.0)
        consumer.flow_active = True
        consumer.active = {TP(INPUT, 0)}  # partition 1 is paused (its tables recover)
        await consumer._wait_next_records(1.0)
        return list(bulk._chunks)

    assert asyncio.run(go()) == []
    assert bulk.dropped == 5

    consumer.fetches = [{TP(INPUT, 0): _recs(2, 2)}, {TP(INPUT, 0): _recs(4, 1)}]
    consumer.active = None

    async def later() -> list[int]:
        await consumer._wait_next_records(1.0)
        app.consumer_generation_id = 2  # fetched before the rebalance finished
        await consumer._wait_next_records(1.0)
        return [r.offset for c in await bulk.take(100) for r in c.records]

    assert asyncio.run(later()) == [4]
    assert bulk.dropped == 7


def test_the_fetcher_waits_for_room_and_gives_up_when_the_flow_is_suspended() -> None:
    consumer = _Consumer([{TP(INPUT, 0): _recs(0, 3)}, {TP(INPUT, 0): _recs(3, 3)}])
    bulk, _ = _bulk(consumer, max_pending=3)

    async def go() -> tuple[bool, list[int]]:
        await consumer._wait_next_records(1.0)
        fetching = asyncio.ensure_future(consumer._wait_next_records(1.0))
        await asyncio.sleep(0.05)
        blocked = not fetching.done()  # 3 pending, room for none
        taken = [r.offset for c in await bulk.take(100) for r in c.records]
        await fetching  # room again: the second fetch is queued
        taken += [r.offset for c in await bulk.take(100) for r in c.records]
        return blocked, taken

    assert asyncio.run(go()) == (True, [0, 1, 2, 3, 4, 5])

    consumer.fetches = [{TP(INPUT, 0): _recs(6, 3)}, {TP(INPUT, 0): _recs(9, 3)}]

    async def suspended() -> int:
        await consumer._wait_next_records(1.0)
        fetching = asyncio.ensure_future(consumer._wait_next_records(1.0))
        await asyncio.sleep(0.05)
        consumer.flow_active = False
        consumer.suspend_flow.set()
        await asyncio.wait_for(fetching, 1.0)
        return bulk.pending

    assert asyncio.run(suspended()) == 3  # the suspended fetch was dropped, not queued


def test_forget_drops_the_queued_chunks_of_revoked_partitions() -> None:
    consumer = _Consumer([{TP(INPUT, 0): _recs(0, 2), TP(INPUT, 1): _recs(0, 2)}])
    bulk, _ = _bulk(consumer)

    async def go() -> list[int]:
        await consumer._wait_next_records(1.0)
        assert bulk.waiting() == {(INPUT, 0), (INPUT, 1)}
        assert bulk.forget([(INPUT, 1)]) == 2
        assert bulk.waiting() == {(INPUT, 0)}
        return [c.partition for c in await bulk.take(100)]

    assert asyncio.run(go()) == [0]
    assert bulk.pending == 0
    assert bulk.waiting() == set()


def test_peek_shows_what_take_would_return_and_leaves_it_queued() -> None:
    fetches = [
        {TP(INPUT, 0): _recs(0, 3)},
        {TP(INPUT, 1): _recs(0, 3)},
        {TP(CHANNELS, 0): _recs(0, 4)},
    ]
    consumer = _Consumer(fetches)
    bulk, app = _bulk(consumer)

    def offsets(chunks: list[Any]) -> list[tuple[str, int, list[int]]]:
        return [(c.topic, c.partition, [r.offset for r in c.records]) for c in chunks]

    async def go() -> list[Any]:
        for _ in range(3):  # three fetches
            await consumer._wait_next_records(1.0)
        app.consumer_generation_id = 2  # a rebalance: what was queued is stale ...
        assert bulk.peek(100) == []  # ... and take would drop it, so peek shows none
        app.consumer_generation_id = 1
        seen = [offsets(bulk.peek(n)) for n in (1, 6, 7, 100)]
        pending = bulk.pending
        taken = offsets(await bulk.take(6))
        return [seen, pending, taken, offsets(bulk.peek(100))]

    seen, pending, taken, rest = asyncio.run(go())
    first, second = (INPUT, 0, [0, 1, 2]), (INPUT, 1, [0, 1, 2])
    assert seen == [
        [first],
        [first, second],
        [first, second],
        [first, second, (CHANNELS, 0, [0, 1, 2, 3])],
    ]
    assert pending == 10  # peeking took nothing
    assert taken == seen[1]  # take(6) returned what peek(6) showed
    assert rest == [(CHANNELS, 0, [0, 1, 2, 3])]
