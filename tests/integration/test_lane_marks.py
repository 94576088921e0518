"""A starting worker reads every lane's report before it steps (real broker).

The lane-marks reader says it caught up only once it read the compacted topic to the end
offset it found when it started: a worker that stepped before would not know the lanes
other processes hold that are still reading, and would decide past their records.
"""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaProducer

from prism.pipeline.core import LaneReport, lane_record
from prism.pipeline.retry import retry_transient
from prism.pipeline.worker._marks import LaneMarks

pytestmark = pytest.mark.integration

LANES = 300  # more than one fetch's worth is not needed; enough that a poll could stop early


async def _publish(bootstrap: str, topic: str) -> None:
    async def once() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await producer.start()
        try:
            for lane in range(LANES):
                rec = lane_record(lane, LaneReport(1_000 + lane, None, idle=lane % 2 == 0), 5.0)
                await producer.send(topic, rec.value, key=rec.key, partition=0)
            await producer.flush()
        finally:
            await producer.stop()

    await retry_transient(once, what="publishing lane reports", bootstrap=bootstrap)


@pytest.mark.timeout(120)
def test_the_reader_reports_caught_up_only_after_every_report_present_at_its_start(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    topic = f"{topic_prefix}.lane-marks"

    async def scenario() -> None:
        await _publish(kafka_bootstrap, topic)
        marks = LaneMarks(topic, {"bootstrap_servers": kafka_bootstrap}, idle_expiry_s=10)
        stopping = False
        reader = asyncio.ensure_future(marks.run(lambda: stopping))
        try:
            assert await marks.wait_caught_up(60), "the reader never caught up"
            assert len(marks.latest) == LANES  # every report written before it started
            assert marks.latest[LANES - 1][0] == LaneReport(1_000 + LANES - 1, None, idle=False)
        finally:
            stopping = True
            await reader
            await marks.close()

    asyncio.run(scenario())


@pytest.mark.timeout(120)
def test_waiting_for_an_unreachable_topic_gives_up_at_its_timeout(topic_prefix: str) -> None:
    async def scenario() -> None:
        marks = LaneMarks(f"{topic_prefix}.lane-marks", {"bootstrap_servers": "127.0.0.1:9"})
        stopping = False
        reader = asyncio.ensure_future(marks.run(lambda: stopping))
        try:
            assert not await marks.wait_caught_up(1.0)
        finally:
            stopping = True
            await reader
            await marks.close()

    asyncio.run(scenario())
