"""Warm-ups on the real broker: a joining member takes slots only once it has read them ahead,
and a restore that starts from a read-ahead's snapshot reads what a full read reads.

``_assignor.defer_cold`` leaves the slots a cold member would take with their holders and
names them as its warm-ups; ``KafkaGroupConsumer.warmed(..., rejoin=True)`` reports them
read and rejoins; the next assignment hands over exactly those. ``StateReader``'s
``read_snapshots(since=...)`` applies what was written after a snapshot to it, and must
give the keys and values a read from the first offset gives: deletes, overwrites and
aborted transactions in between included.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition

from prism.pipeline.retry import retry_transient
from prism.pipeline.worker._consumer import KafkaGroupConsumer
from prism.pipeline.worker._state import Snapshot, StateReader
from tests.fixtures.kafka_io import new_topic, until

pytestmark = [pytest.mark.integration]

SESSION_S = 8.0


class Calls:
    def __init__(self) -> None:
        self.seen: list[tuple[str, frozenset[TopicPartition]]] = []

    async def revoked(self, tps: set[TopicPartition]) -> None:
        self.seen.append(("revoked", frozenset(tps)))

    async def assigned(self, tps: set[TopicPartition]) -> None:
        self.seen.append(("assigned", frozenset(tps)))


async def _polling(c: KafkaGroupConsumer, stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            await c.fetch(100, 0.05)
        except Exception:  # stopped under the loop
            return
        await asyncio.sleep(0.05)


async def _join_and_warm(bootstrap: str) -> None:
    topic, group = await new_topic(bootstrap, 4, "warmup"), f"g{uuid.uuid4().hex[:10]}"
    a_calls, b_calls = Calls(), Calls()
    kw = {"bootstrap_servers": bootstrap}
    a = KafkaGroupConsumer(group, kw, session_timeout_s=SESSION_S)
    b = KafkaGroupConsumer(group, kw, session_timeout_s=SESSION_S)
    stop = asyncio.Event()
    polls = []
    try:
        await a.start([topic], a_calls)
        polls.append(asyncio.create_task(_polling(a, stop)))
        await until("a holding the four partitions", lambda: len(a.assignment()) == 4)
        a_calls.seen.clear()
        await b.start([topic], b_calls)
        polls.append(asyncio.create_task(_polling(b, stop)))
        await until(
            "b joined, asked to warm up two partitions",
            lambda: len(b.warmup()) == 2,
            seen=lambda: f"a saw {a_calls.seen}, b saw {b_calls.seen}",
        )
        asked = b.warmup()
        await asyncio.sleep(SESSION_S / 2)  # b has not reported them: nothing moves
        assert b.assignment() == set()
        assert len(a.assignment()) == 4 and asked <= a.assignment()
        a_calls.seen.clear()
        b.warmed(asked, rejoin=True)  # read ahead: b rejoins
        await until(
            "b holding the partitions it warmed",
            lambda: b.assignment() == asked,
            seen=lambda: f"a saw {a_calls.seen}, b saw {b_calls.seen}, b holds {b.assignment()}",
        )
        assert a.assignment() == {TopicPartition(topic, p) for p in range(4)} - asked
        assert b.warmup() == set()
        assert [kind for kind, _ in a_calls.seen] == ["revoked", "assigned"]  # one rebalance
    finally:
        stop.set()
        for poll in polls:
            poll.cancel()
        await b.stop()
        await a.stop()


@pytest.mark.timeout(180)
def test_a_joining_member_takes_partitions_only_after_reporting_them_read(
    kafka_bootstrap: str,
) -> None:
    asyncio.run(_join_and_warm(kafka_bootstrap))


async def _send(
    producer: AIOKafkaProducer, topic: str, records: list[tuple[bytes, bytes | None]], commit: bool
) -> None:
    await producer.begin_transaction()
    for key, value in records:
        await producer.send_and_wait(topic, value, key=key, partition=0)
    if commit:
        await producer.commit_transaction()
    else:
        await producer.abort_transaction()


async def _read_until(reader: StateReader, want: dict[bytes, bytes]) -> Snapshot:
    """A full read once it gives ``want``: a commit's markers reach the partition just after
    the commit returns, and a read-committed read ends at the last stable offset before
    them (a slot's new owner fences the old producer first, which waits for them)."""
    for _ in range(100):
        got = (await reader.read_snapshots([0]))[0]
        if got.state == want:
            return got
        await asyncio.sleep(0.1)
    raise AssertionError(f"the partition did not read {want} in 100 reads: {got.state}")


async def _snapshot_then_catch_up(bootstrap: str) -> None:
    topic = await new_topic(bootstrap, 1, "state")
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, transactional_id=f"t{uuid.uuid4().hex[:8]}"
    )
    await retry_transient(producer.start, what="starting a producer", bootstrap=bootstrap)
    reader = StateReader(topic, {"bootstrap_servers": bootstrap})
    try:
        await _send(producer, topic, [(b"a", b"1"), (b"b", b"1"), (b"c", b"1")], commit=True)
        snapshot = await _read_until(reader, {b"a": b"1", b"b": b"1", b"c": b"1"})
        await _send(producer, topic, [(b"a", None), (b"b", b"2"), (b"d", b"1")], commit=True)
        await _send(producer, topic, [(b"b", b"aborted"), (b"e", b"aborted")], commit=False)
        await _send(producer, topic, [(b"c", b"3")], commit=True)
        full = await _read_until(reader, {b"b": b"2", b"c": b"3", b"d": b"1"})
        assert reader.last_read[1] == 7  # every committed record
        base = dict(snapshot.state)
        caught_up = (await reader.read_snapshots([0], {0: snapshot}))[0]
        assert reader.last_read[1] == 4  # a, b, d and c: the committed ones since the snapshot
        assert snapshot.state == base  # the snapshot itself is left as it was
        assert caught_up.state == full.state
        assert caught_up.end == full.end > snapshot.end
        # a snapshot older than SNAPSHOT_MAX_AGE_S is no base: read from the start
        stale = type(snapshot)({b"zombie": b"1"}, snapshot.end, snapshot.at - 10_000)
        assert (await reader.read_snapshots([0], {0: stale}))[0].state == full.state
    finally:
        await reader.close()
        await producer.stop()


@pytest.mark.timeout(120)
def test_a_read_from_a_snapshot_on_equals_a_read_from_the_start(kafka_bootstrap: str) -> None:
    asyncio.run(_snapshot_then_catch_up(kafka_bootstrap))
