"""``ReadBack.read`` on the real broker: the offsets asked for, in order, read committed.

The worker reads offsets back when a fetch begins past its position, or when the
consumer's position has stayed past it (``_watch``). On the input topic every offset is a
record; on a topic written in transactions some offsets are markers or aborted records,
which a read-committed read-back must skip rather than wait for.
"""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from prism.pipeline.worker._offsets import ReadBack

pytestmark = pytest.mark.integration


async def _topic(bootstrap: str, topic: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])
    finally:
        await admin.close()


def test_read_back_returns_the_ranges_asked_for(kafka_bootstrap: str, topic_prefix: str) -> None:
    topic = f"{topic_prefix}.read-back"

    async def scenario() -> None:
        await _topic(kafka_bootstrap, topic)
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=True)
        await producer.start()
        try:
            for i in range(50):
                await producer.send(topic, f"r{i}".encode(), key=b"k", partition=1)
            await producer.flush()
        finally:
            await producer.stop()
        rb = ReadBack(topic, {"bootstrap_servers": kafka_bootstrap})
        try:
            recs = await rb.read(1, [(0, 3), (40, 50)])
            assert [r.offset for r in recs] == [0, 1, 2, *range(40, 50)]
            assert [r.value for r in recs[:3]] == [b"r0", b"r1", b"r2"]
            assert {(r.source, r.partition, r.key) for r in recs} == {(topic, 1, b"k")}
            assert await rb.read(1, [(10, 10)]) == []  # an empty range reads nothing
        finally:
            await rb.close()

    asyncio.run(scenario())


def test_read_back_skips_markers_and_aborted_records(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    topic = f"{topic_prefix}.read-back-txn"

    async def scenario() -> None:
        await _topic(kafka_bootstrap, topic)
        producer = AIOKafkaProducer(
            bootstrap_servers=kafka_bootstrap, transactional_id=f"{topic_prefix}-rb"
        )
        await producer.start()
        try:
            async with producer.transaction():
                await producer.send(topic, b"kept-1", partition=0)
            await producer.begin_transaction()
            await producer.send(topic, b"aborted", partition=0)
            await producer.abort_transaction()
            async with producer.transaction():
                await producer.send(topic, b"kept-2", partition=0)
        finally:
            await producer.stop()
        # offsets: 0 kept-1, 1 commit marker, 2 aborted, 3 abort marker, 4 kept-2, 5 marker
        rb = ReadBack(topic, {"bootstrap_servers": kafka_bootstrap})
        try:
            recs = await rb.read(0, [(0, 6)])
            assert [(r.offset, r.value) for r in recs] == [(0, b"kept-1"), (4, b"kept-2")]
        finally:
            await rb.close()

    asyncio.run(scenario())
