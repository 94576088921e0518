"""The simulated fleet reaches a real broker intact: every record, keyed by runId, in run order."""

from __future__ import annotations

from collections import defaultdict

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from prism.pipeline.cli import main
from prism.runtime.simulator import FleetConfig, SimulatorPublishError, publish_to_kafka, simulate
from tests.fixtures.kafka_io import create_topic

pytestmark = pytest.mark.integration


async def _read_all(bootstrap: str, topic: str, partitions: int) -> dict[int, list]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        out: dict[int, list] = defaultdict(list)
        while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
            batch = await consumer.getmany(timeout_ms=1000, max_records=5000)
            for tp, msgs in batch.items():
                out[tp.partition].extend(msgs)
        return out
    finally:
        await consumer.stop()


@pytest.mark.timeout(120)
async def test_fleet_is_published_whole_keyed_by_run(kafka_bootstrap: str, topic_prefix: str):
    topic = f"{topic_prefix}.agent-events"
    await create_topic(kafka_bootstrap, topic, 3)
    fleet = simulate(
        FleetConfig(
            runs=60,
            seed=8,
            duplicates=0.05,
            reorder_window=2,
            malformed=0.05,
            oversized=0.03,
            post_terminal=0.05,
        )
    )
    result = await publish_to_kafka(fleet, kafka_bootstrap, topic, progress=False)
    assert result.records == len(fleet.records)

    got = await _read_all(kafka_bootstrap, topic, 3)
    assert {p: len(m) for p, m in got.items()} == result.per_partition
    assert sum(len(m) for m in got.values()) == len(fleet.records)
    # Keys are run ids; a run lives on one partition, in the fleet's delivery order.
    sent: dict[bytes, list[bytes]] = defaultdict(list)
    for rec in fleet.records:
        sent[rec.key].append(rec.value)
    received: dict[bytes, list[bytes]] = defaultdict(list)
    partition_of: dict[bytes, set[int]] = defaultdict(set)
    for partition, msgs in got.items():
        for msg in msgs:
            received[msg.key].append(msg.value)
            partition_of[msg.key].add(partition)
            headers = dict(msg.headers)
            assert headers["content-type"] == b"application/json"
            assert headers["traceparent"].startswith(b"00-")
    assert received == sent
    assert all(len(parts) == 1 for parts in partition_of.values())
    assert set(sent) == {run_id.encode() for run_id in fleet.manifest["runs"]}
    assert any(len(v) > fleet.config.max_event_bytes for vs in received.values() for v in vs)


@pytest.mark.timeout(120)
async def test_cli_publishes_at_a_rate(kafka_bootstrap: str, topic_prefix: str, capsys):
    topic = f"{topic_prefix}.agent-events"
    await create_topic(kafka_bootstrap, topic, 2)
    import asyncio

    code = await asyncio.to_thread(
        main,
        [
            "simulate",
            "--runs",
            "20",
            "--seed",
            "3",
            "--kafka",
            kafka_bootstrap,
            "--topic",
            topic,
            "--rate",
            "5000",
            "--no-progress",
        ],
    )
    assert code == 0
    expected = len(simulate(FleetConfig(runs=20, seed=3)).records)
    got = await _read_all(kafka_bootstrap, topic, 2)
    assert sum(len(m) for m in got.values()) == expected
    assert f"produced {expected} records to {topic}" in capsys.readouterr().out


@pytest.mark.timeout(60)
async def test_unreachable_broker_is_a_clear_error() -> None:
    fleet = simulate(FleetConfig(runs=1, seed=1))
    with pytest.raises(SimulatorPublishError, match=r"127\.0\.0\.1:9"):
        await publish_to_kafka(fleet, "127.0.0.1:9", "t", progress=False, request_timeout_ms=2000)


@pytest.mark.timeout(120)
async def test_channel_records_and_the_quiet_partition_reach_the_broker(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    topic = f"{topic_prefix}.agent-events"
    channel_topic = f"{topic_prefix}.channel-operations"
    await create_topic(kafka_bootstrap, topic, 4)
    await create_topic(kafka_bootstrap, channel_topic, 2)
    fleet = simulate(
        FleetConfig(runs=60, seed=5, hostile=0.05, channel_operations=40, partitions=4)
    )
    result = await publish_to_kafka(fleet, kafka_bootstrap, topic, progress=False)
    channel = [r for r in fleet.records if r.family == "channel"]
    assert result.per_topic == {
        topic: len(fleet.records) - len(channel),
        channel_topic: len(channel),
    }

    got_channel = await _read_all(kafka_bootstrap, channel_topic, 2)
    received = sorted((m.key, m.value) for msgs in got_channel.values() for m in msgs)
    assert received == sorted((r.key, r.value) for r in channel)
    got = await _read_all(kafka_bootstrap, topic, 4)
    quiet = fleet.manifest["injected"]["quiet_partition"]
    quiet_runs = {r for r, k in fleet.manifest["injected"]["hostile_runs"].items()
                  if k == "quiet_partition"}  # fmt: skip
    assert quiet_runs and {m.key.decode() for m in got[quiet]} == quiet_runs
    assert {fleet.manifest["runs"][r]["status"] for r in quiet_runs} == {"incomplete"}
