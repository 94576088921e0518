"""A quiet partition's records are handed out beside a busy partition's backlog, not after it.

The worker's consumer (``KafkaGroupConsumer.fetch``) on the real broker, one member of a
6-partition topic: partition 0 holds a backlog of 30,000 records, and after it was fetched
one record lands on each of the five others. aiokafka alone hands out partition 0's chunk
in hand (about 10,000 records) before the later ones, so those records waited 20 fetches of
500; the worker's fetch gives every partition in hand its share first, so they come in the
next fetch. Each partition's records still come once each, in offset order.

Records in hand were fetched a batch ago, and aiokafka fetches a partition again only
once they are all taken; with ``linger_s`` the fetch that takes them also waits for that
next fetch, so the records that reached the broker meanwhile come in the same batch.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition

from prism.pipeline.retry import retry_transient
from prism.pipeline.worker._consumer import KafkaGroupConsumer
from tests.fixtures.kafka_io import new_topic, until

pytestmark = [pytest.mark.integration]

BACKLOG = 30_000
BATCH = 500


class _Handler:
    async def revoked(self, tps: set[TopicPartition]) -> None:
        return None

    async def assigned(self, tps: set[TopicPartition]) -> None:
        return None


async def _run(bootstrap: str) -> tuple[list[tuple[int, int]], dict[int, list[int]]]:
    topic, group = await new_topic(bootstrap, 6, "fair"), f"fair{uuid.uuid4().hex[:8]}"
    tps = [TopicPartition(topic, p) for p in range(6)]
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20)
    await retry_transient(producer.start, what="starting a producer", bootstrap=bootstrap)
    consumer = KafkaGroupConsumer(group, {"bootstrap_servers": bootstrap}, max_poll_records=BATCH)
    try:
        sends = [await producer.send(topic, b"x" * 80, partition=0) for _ in range(BACKLOG)]
        await asyncio.gather(*sends)
        await consumer.start([topic], _Handler())

        def backlog_in_hand() -> bool:  # fetched from offset 0, nothing handed out yet
            return consumer.highwater(tps[0]) == BACKLOG

        await until("partition 0's backlog fetched", backlog_in_hand)
        for tp in tps[1:]:
            await (await producer.send(topic, b"quiet", partition=tp.partition))

        def quiet_in_hand() -> bool:
            return all(consumer.highwater(tp) == 1 for tp in tps[1:])

        await until("the quiet partitions' records fetched", quiet_in_hand)
        # each fetch, in order: (records of partition 0, records of the quiet ones); and
        # every partition's offsets in the order they came
        fetches: list[tuple[int, int]] = []
        offsets: dict[int, list[int]] = {tp.partition: [] for tp in tps}
        while sum(map(len, offsets.values())) < BACKLOG + 5:
            fetched = await consumer.fetch(BATCH, 1.0)
            assert len(fetched) <= BATCH
            busy = len(fetched.records.get(tps[0], []))
            fetches.append((busy, len(fetched) - busy))
            for tp, records in fetched.records.items():
                offsets[tp.partition].extend(r.offset for r in records)
        return fetches, offsets
    finally:
        await producer.stop()
        await consumer.stop()


@pytest.mark.timeout(180)
def test_a_quiet_partition_is_not_kept_behind_a_busy_ones_backlog(kafka_bootstrap: str) -> None:
    fetches, offsets = asyncio.run(_run(kafka_bootstrap))
    assert offsets[0] == list(range(BACKLOG))  # once each, in offset order
    assert all(offsets[p] == [0] for p in range(1, 6)), offsets
    # all five in the first fetch after they arrived: none waited behind partition 0's chunk
    assert fetches[0][1] == 5, f"(partition 0, quiet) records per fetch: {fetches[:25]}"


async def _refetch(bootstrap: str) -> tuple[list[int], list[int]]:
    """(offsets of a fetch without ``linger_s``, offsets of one with it), each taken when
    ten records were in hand and ten more had reached the broker since."""
    topic, group = await new_topic(bootstrap, 1, "refetch"), f"refetch{uuid.uuid4().hex[:8]}"
    tp = TopicPartition(topic, 0)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await retry_transient(producer.start, what="starting a producer", bootstrap=bootstrap)
    consumer = KafkaGroupConsumer(group, {"bootstrap_servers": bootstrap}, max_poll_records=BATCH)

    async def send_ten() -> None:
        await asyncio.gather(*[await producer.send(topic, b"x", partition=0) for _ in range(10)])

    try:
        await send_ten()
        await consumer.start([topic], _Handler())
        await until("offsets 0-9 in hand", lambda: consumer.highwater(tp) == 10)
        await send_ten()  # 10-19 at the broker, not fetched: 0-9 are still in hand
        plain = await consumer.fetch(BATCH, 1.0)
        await until("offsets 10-19 in hand", lambda: consumer.highwater(tp) == 20)
        await send_ten()  # 20-29 at the broker
        lingered = await consumer.fetch(BATCH, 1.0, linger_s=30.0)  # returns when they come
        return (
            [r.offset for r in plain.records.get(tp, [])],
            [r.offset for r in lingered.records.get(tp, [])],
        )
    finally:
        await producer.stop()
        await consumer.stop()


@pytest.mark.timeout(180)
def test_a_fetch_that_takes_all_in_hand_waits_for_the_fetch_that_starts(
    kafka_bootstrap: str,
) -> None:
    plain, lingered = asyncio.run(_refetch(kafka_bootstrap))
    assert plain == list(range(10))  # what was in hand, fetched before 10-19 were sent
    assert lingered == list(range(10, 30))  # in hand, and what reached the broker since
