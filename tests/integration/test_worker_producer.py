"""The worker's slot transactions against the real broker (``_checkpoint.Transactions``).

Every record of a committed transaction lands, in order per partition, on the partition
it names or the one its key chooses as a Java client would, and the group's offsets
carry the commit's metadata; a producer fenced by a newer one of its slot commits nothing
that a read-committed reader sees, offsets included."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Mapping

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from prism.pipeline.settings import Settings
from prism.pipeline.worker._checkpoint import (
    Fenced,
    SlotCommit,
    Transactions,
    quiet_fenced_futures,
)
from prism.pipeline.worker._produce import ProducedRecord
from tests.fixtures.kafka_io import create_topic, read_committed

pytestmark = pytest.mark.integration

KEYS = (b"run-a", b"run-b", b"run-c", b"0197a3c8-aaaa-7bbb-8ccc-1234567890ab")
# org.apache.kafka.common.utils.UtilsTest.testMurmur2: key -> murmur2
JAVA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


def _java_murmur2(data: bytes) -> int:
    """org.apache.kafka.common.utils.Utils.murmur2, written out independently of aiokafka."""
    m, r = 0x5BD1E995, 24
    h = (0x9747B28C ^ len(data)) & 0xFFFFFFFF
    n4 = len(data) // 4
    for i in range(n4):
        k = int.from_bytes(data[4 * i : 4 * i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    tail = data[4 * n4 :]
    if len(tail) >= 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if tail:
        h ^= tail[0]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def _java_partition(key: bytes, partitions: int) -> int:
    """BuiltInPartitioner.partitionForKey: toPositive(murmur2(key)) % partitions."""
    return (_java_murmur2(key) & 0x7FFFFFFF) % partitions


def test_the_reference_murmur2_matches_kafkas_own_test_vectors() -> None:
    assert {k: _java_murmur2(k) for k in JAVA_VECTORS} == JAVA_VECTORS


def test_records_land_in_order_on_their_partitions(kafka_bootstrap: str, topic_prefix: str) -> None:
    topic = f"{topic_prefix}.produced"
    big = b"x" * 300_000  # four of these overflow a 1 MiB record batch: several per partition
    records = [ProducedRecord(topic, b"p2-%d" % i, big, 2) for i in range(5)]
    records += [ProducedRecord(topic, key, b"%s-%d" % (key, i)) for i in range(4)
                for key in KEYS]  # fmt: skip
    records += [ProducedRecord(topic, b"p0", None, 0, (("h", b"v"),))]  # a tombstone, a header

    async def scenario() -> None:
        await create_topic(kafka_bootstrap, topic, 3)
        txns = Transactions(f"{topic_prefix}-g", {"bootstrap_servers": kafka_bootstrap})
        try:
            await txns.open("0")
            offsets = {TopicPartition(topic, 1): 7}
            await txns.commit("0", SlotCommit(records, offsets), "worker-a:1")
        finally:
            await txns.close_all()
        want = {1: (7, "worker-a:1")}
        assert await _committed(kafka_bootstrap, f"{topic_prefix}-g", topic, want) == want

    asyncio.run(scenario())
    got: dict[int, list[tuple[bytes | None, bytes | None, list]]] = {0: [], 1: [], 2: []}
    for r in read_committed(Settings(kafka_bootstrap_servers=kafka_bootstrap), topic, 3):
        got[r.partition].append((r.key, r.value, list(r.headers)))
    expected: dict[int, list[tuple[bytes | None, bytes | None, list]]] = {0: [], 1: [], 2: []}
    for r in records:
        p = r.partition if r.partition is not None else _java_partition(r.key or b"", 3)
        expected[p].append((r.key, r.value, list(r.headers)))
    assert len({_java_partition(k, 3) for k in KEYS}) > 1  # the keys spread: the test can fail
    assert got == expected


def test_a_tail_names_where_the_records_before_it_landed(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    """``SlotCommit.tail`` gets the offset of the last record written to each partition
    and its records join the same transaction (the slot's position record naming the
    offsets of the copies it forwarded)."""
    topic = f"{topic_prefix}.tailed"
    seen: list[dict[tuple[str, int], int]] = []

    def tail(produced: Mapping[tuple[str, int], int]) -> list[ProducedRecord]:
        seen.append(dict(produced))
        named = orjson.dumps({f"{t}:{p}": o for (t, p), o in sorted(produced.items())})
        return [ProducedRecord(topic, b"tail", named, 0)]

    async def scenario() -> None:
        await create_topic(kafka_bootstrap, topic, 2)
        txns = Transactions(f"{topic_prefix}-g", {"bootstrap_servers": kafka_bootstrap})
        try:
            await txns.open("0")
            first = [ProducedRecord(topic, b"a", b"%d" % i, i % 2) for i in range(5)]
            await txns.commit("0", SlotCommit(first, {}, tail), "worker-a:1")
            done = {TopicPartition(topic, 1): 9}  # the offsets: readable once it is whole
            await txns.commit("0", SlotCommit(first[:2], done, tail), "worker-a:2")
        finally:
            await txns.close_all()
        want = {1: (9, "worker-a:2")}
        assert await _committed(kafka_bootstrap, f"{topic_prefix}-g", topic, want) == want

    asyncio.run(scenario())
    got: dict[int, list[tuple[int, bytes | None]]] = {0: [], 1: []}
    for r in read_committed(Settings(kafka_bootstrap_servers=kafka_bootstrap), topic, 2):
        got[r.partition].append((r.offset, r.value))
    # a transaction's commit marker takes an offset of its own in each partition it wrote
    values = {p: [v for _, v in recs] for p, recs in got.items()}
    assert values == {0: [b"0", b"2", b"4", _named(seen[0]), b"0", _named(seen[1])],
                      1: [b"1", b"3", b"1"]}  # fmt: skip
    assert seen[0] == {(topic, 0): got[0][2][0], (topic, 1): got[1][1][0]}  # "4" and "3"
    assert seen[1] == {(topic, 0): got[0][4][0], (topic, 1): got[1][2][0]}


def _named(produced: Mapping[tuple[str, int], int]) -> bytes:
    return orjson.dumps({f"{t}:{p}": o for (t, p), o in sorted(produced.items())})


async def _committed(
    bootstrap: str, group: str, topic: str, want: dict[int, tuple[int, str]]
) -> dict[int, tuple[int, str]]:
    """The group's committed offsets of ``topic`` once they are ``want`` (or as last seen,
    after 30 s). A transaction's offsets become readable when its commit markers are
    written, which the broker does after ``commit`` returned (aiokafka's offset fetch does
    not ask it to wait for them)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        for _ in range(300):
            found = await admin.list_consumer_group_offsets(group)
            seen = {tp.partition: (om.offset, om.metadata) for tp, om in found.items()
                    if tp.topic == topic}  # fmt: skip
            if seen == want:
                break
            await asyncio.sleep(0.1)
        return seen
    finally:
        await admin.close()


def test_a_fenced_slot_commits_nothing(
    kafka_bootstrap: str, topic_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    topic = f"{topic_prefix}.fenced"
    group = f"{topic_prefix}-g"
    tp = TopicPartition(topic, 0)

    async def scenario() -> list[bytes | None]:
        quiet_fenced_futures(asyncio.get_running_loop())  # as the worker's loop does
        await create_topic(kafka_bootstrap, topic, 1)
        zombie = Transactions(group, {"bootstrap_servers": kafka_bootstrap})
        owner = Transactions(group, {"bootstrap_servers": kafka_bootstrap})
        try:
            await zombie.open("3")
            await zombie.commit("3", SlotCommit([ProducedRecord(topic, b"k", b"old", 0)],
                                                {tp: 1}), "zombie:1")  # fmt: skip
            await owner.open("3")  # the group gave slot 3 to another process
            with pytest.raises(Fenced, match="slot 3"):
                await zombie.commit("3", SlotCommit([ProducedRecord(topic, b"k", b"stale", 0)],
                                                    {tp: 9}), "zombie:2")  # fmt: skip
            assert "3" not in zombie.producers  # closed: it may not try again
            await owner.commit("3", SlotCommit([ProducedRecord(topic, b"k", b"new", 0)],
                                               {tp: 2}), "owner:1")  # fmt: skip
        finally:
            await zombie.close_all()
            await owner.close_all()
        want = {0: (2, "owner:1")}  # never the zombie's offset 9
        assert await _committed(kafka_bootstrap, group, topic, want) == want
        consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, enable_auto_commit=False,
                                    isolation_level="read_committed")  # fmt: skip
        await consumer.start()
        try:
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            end = (await consumer.end_offsets([tp]))[tp]
            values: list[bytes | None] = []
            while await consumer.position(tp) < end:
                for recs in (await consumer.getmany(tp, timeout_ms=5000)).values():
                    values += [r.value for r in recs]
            return values
        finally:
            await consumer.stop()

    # at INFO: a DEBUG record of the abort would keep its traceback, and with it the
    # fenced producer's leftovers, alive past the collection below
    with caplog.at_level(logging.INFO):
        assert asyncio.run(scenario()) == [b"old", b"new"]
        gc.collect()  # the fenced producer's leftovers are reported as they are collected
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
