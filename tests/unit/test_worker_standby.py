"""A joining member's read-ahead (``pipeline/worker/_standby.py``): what it reads, when it
rejoins, and what it hands to a restore."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection
from typing import Any

from aiokafka import TopicPartition

from prism.pipeline.worker._standby import Standby
from prism.pipeline.worker._state import SNAPSHOT_MAX_AGE_S, Snapshot

SLOT_TOPICS = ("in", "in.repartition", "ops", "ops.repartition")


class _Reader:
    def __init__(self, fail: bool = False) -> None:
        self.reads: list[list[int]] = []
        self.fail = fail
        self.gate: asyncio.Event | None = None
        self.last_read = (0, 0, 0.0)

    async def read_snapshots(self, partitions: Any, since: Any = None) -> dict[int, Snapshot]:
        self.reads.append(sorted(partitions))
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise ConnectionError("broker away")
        self.last_read = (len(partitions), len(partitions), 0.0)
        return {p: Snapshot({b"k": str(p).encode()}, 10 + p, time.monotonic()) for p in partitions}

    async def close(self) -> None: ...


class _Consumer:
    def __init__(self) -> None:
        self.reported: list[tuple[frozenset[TopicPartition], bool]] = []

    def warmed(self, tps: Collection[TopicPartition], *, rejoin: bool) -> None:
        self.reported.append((frozenset(tps), rejoin))


def _slot(p: int) -> set[TopicPartition]:
    return {TopicPartition(t, p) for t in SLOT_TOPICS}


def _standby(reader: _Reader, consumer: _Consumer, interval: float = 0.0) -> Standby:
    return Standby(reader, consumer, SLOT_TOPICS, min_interval_s=interval)  # type: ignore[arg-type]


async def _settled(s: Standby) -> None:
    for _ in range(100):
        await asyncio.sleep(0)
    task = s._task
    if task is not None:
        await asyncio.wait_for(asyncio.shield(task), 5)


async def test_it_reads_the_warm_up_slots_ahead_then_rejoins_reporting_them() -> None:
    reader, consumer = _Reader(), _Consumer()
    s = _standby(reader, consumer)
    asked = _slot(2) | _slot(5) | {TopicPartition("deaths", 0)}
    s.want(asked)
    await _settled(s)
    assert reader.reads == [[2, 5]]  # the slots; the alerter's partition has nothing ahead
    assert consumer.reported == [(frozenset(asked), True)]
    s.want(asked)  # the same warm-ups again (an assignment in flight): nothing more
    await _settled(s)
    assert reader.reads == [[2, 5]] and len(consumer.reported) == 1
    snapshot = s.take(2)
    assert snapshot is not None and snapshot.state == {b"k": b"2"}
    assert s.take(2) is None  # handed over once


async def test_new_warm_ups_keep_the_snapshots_still_asked_for_and_read_only_the_rest() -> None:
    reader, consumer = _Reader(), _Consumer()
    s = _standby(reader, consumer)
    s.want(_slot(1) | _slot(2))
    await _settled(s)
    s.want(_slot(2) | _slot(3))
    await _settled(s)
    assert reader.reads == [[1, 2], [3]]
    assert set(s.snapshots) == {2, 3}
    s.want(set())  # taken over, or no longer asked: nothing is kept
    assert s.snapshots == {}


async def test_warm_ups_changed_mid_read_cancel_the_read_and_rejoin_once() -> None:
    reader, consumer = _Reader(), _Consumer()
    reader.gate = asyncio.Event()
    s = _standby(reader, consumer)
    s.want(_slot(1))
    await asyncio.sleep(0)
    s.want(_slot(4))  # a rebalance meanwhile asked for another slot
    reader.gate.set()
    await _settled(s)
    assert consumer.reported == [(frozenset(_slot(4)), True)]
    assert set(s.snapshots) == {4}


async def test_a_failed_read_ahead_still_rejoins_and_leaves_a_full_restore() -> None:
    reader, consumer = _Reader(fail=True), _Consumer()
    s = _standby(reader, consumer)
    s.want(_slot(7))
    await _settled(s)
    assert consumer.reported == [(frozenset(_slot(7)), True)]  # not cold for good
    assert s.take(7) is None


async def test_a_snapshot_older_than_the_bound_is_not_handed_to_a_restore() -> None:
    s = _standby(_Reader(), _Consumer())
    s.snapshots[3] = Snapshot({b"k": b"v"}, 5, time.monotonic() - SNAPSHOT_MAX_AGE_S - 1)
    assert s.take(3) is None


async def test_rejoins_are_at_least_the_interval_apart() -> None:
    reader, consumer = _Reader(), _Consumer()
    s = _standby(reader, consumer, interval=0.3)
    s.want(_slot(1))
    await _settled(s)
    first = time.monotonic()
    s.want(_slot(2))
    await _settled(s)
    assert time.monotonic() - first >= 0.25
    assert [rejoin for _, rejoin in consumer.reported] == [True, True]
