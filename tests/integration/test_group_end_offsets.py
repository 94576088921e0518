"""The worker consumer's end offsets: the last stable offset, asked outside the group.

``KafkaGroupConsumer.end_offsets`` asks on connections of its own (a broker answers one
request of a connection at a time, and the group consumer's connections carry its
long-polling fetches). What it answers must still be what the tick needs: read committed,
the end stops before an open transaction and passes committed records and their marker,
for assigned partitions and for others alike, and again after a new write.
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


class _Handler:
    def __init__(self) -> None:
        self.held: set[TopicPartition] = set()

    async def revoked(self, tps: set[TopicPartition]) -> None:
        self.held -= tps

    async def assigned(self, tps: set[TopicPartition]) -> None:
        self.held |= tps


async def _run(bootstrap: str) -> tuple[list[TopicPartition], list[dict[TopicPartition, int]]]:
    topic, other = await new_topic(bootstrap, 2, "ends"), await new_topic(bootstrap, 1, "ends")
    group = f"ends{uuid.uuid4().hex[:8]}"
    p0, p1, elsewhere = TopicPartition(topic, 0), TopicPartition(topic, 1), TopicPartition(other, 0)
    txn = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"{group}.t")
    plain = AIOKafkaProducer(bootstrap_servers=bootstrap)
    for p in (txn, plain):
        await retry_transient(p.start, what="starting a producer", bootstrap=bootstrap)
    consumer = KafkaGroupConsumer(group, {"bootstrap_servers": bootstrap})
    handler = _Handler()
    seen: list[dict[TopicPartition, int]] = []
    try:
        await consumer.start([topic], handler)
        await until("the partitions assigned", lambda: handler.held == {p0, p1})
        # the group consumer now long-polls both quiet partitions
        await consumer.fetch(10, 0.6)
        seen.append(await consumer.end_offsets([p0, p1, elsewhere]))
        async with txn.transaction():  # offsets 0..2, then the commit marker at 3
            for _ in range(3):
                await txn.send(topic, b"committed", partition=0)
        await txn.begin_transaction()  # offsets 4..5, open
        for _ in range(2):
            await txn.send_and_wait(topic, b"open", partition=0)
        await plain.send_and_wait(other, b"plain", partition=0)
        seen.append(await consumer.end_offsets([p0, p1, elsewhere]))
        await txn.commit_transaction()  # its marker at 6, written after EndTxn returns
        for _ in range(100):  # the end moves once the marker is written: the next tick's
            last = await consumer.end_offsets([p0])
            if last[p0] != 4:
                break
            await asyncio.sleep(0.1)
        seen.append(last)
        return [p0, p1, elsewhere], seen
    finally:
        await consumer.stop()
        await txn.stop()
        await plain.stop()


@pytest.mark.timeout(120)
def test_end_offsets_are_the_last_stable_offsets_of_any_partition(kafka_bootstrap: str) -> None:
    (p0, p1, elsewhere), (empty, open_txn, committed) = asyncio.run(_run(kafka_bootstrap))
    assert empty == {p0: 0, p1: 0, elsewhere: 0}
    # p0: three committed records and their marker, not the open transaction's two
    assert open_txn == {p0: 4, p1: 0, elsewhere: 1}
    assert committed == {p0: 7}  # the open transaction committed: its marker at 6, no other
