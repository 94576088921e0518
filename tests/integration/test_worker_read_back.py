"""The worker's guard against offsets faust skips: ``ReadBack.fill`` on the real broker.

faust can drop records it fetched when a rebalance suspends the flow and then deliver a
partition from a later offset. ``fill`` finds the missing offsets from the worker's own
position (or the group's committed offset, or the log's start) and reads them back.
"""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from prism.pipeline.core import InRecord
from prism.pipeline.worker._offsets import ReadBack

pytestmark = pytest.mark.integration


async def _topic_with(bootstrap: str, topic: str, count: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
    await producer.start()
    try:
        for i in range(count):
            await producer.send(topic, f"r{i}".encode(), key=b"k", partition=1)
        await producer.flush()
    finally:
        await producer.stop()


def _delivered(topic: str, offsets: range) -> list[InRecord]:
    return [InRecord(f"r{o}".encode(), topic, 1, o, b"k", None) for o in offsets]


def test_fill_reads_back_what_the_consumer_skipped(kafka_bootstrap: str, topic_prefix: str) -> None:
    topic = f"{topic_prefix}.read-back"

    async def scenario() -> None:
        await _topic_with(kafka_bootstrap, topic, 50)
        rb = ReadBack(topic, {"bootstrap_servers": kafka_bootstrap})
        try:
            assert await rb.log_start(1) == 0

            # A fresh partition, nothing committed: faust delivers from 30 on.
            recs, gaps = await rb.fill(1, None, None, _delivered(topic, range(30, 50)))
            assert gaps == [(0, 30)]
            assert [r.offset for r in recs] == list(range(50))
            assert [r.value for r in recs[:3]] == [b"r0", b"r1", b"r2"]

            # Committed 20, no state: only 20..29 are missing.
            recs, gaps = await rb.fill(1, None, 20, _delivered(topic, range(30, 50)))
            assert gaps == [(20, 30)] and [r.offset for r in recs] == list(range(20, 50))

            # The worker's position wins over the committed offset; holes inside the batch.
            batch = _delivered(topic, range(45, 50)) + _delivered(topic, range(42, 43))
            recs, gaps = await rb.fill(1, 40, 10, batch)
            assert gaps == [(40, 42), (43, 45)]
            assert [r.offset for r in recs] == list(range(40, 50))

            # Nothing missing: the batch as delivered, nothing read.
            delivered = _delivered(topic, range(10, 20))
            recs, gaps = await rb.fill(1, 10, 5, delivered)
            assert gaps == [] and recs == delivered
        finally:
            await rb.close()

    asyncio.run(scenario())
