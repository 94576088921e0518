"""The scripted stack is real: records go through the broker, rows through chDB."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from prism.devstack import DevstackError, LocalKafka, free_port, kafka_home

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


async def test_records_round_trip_through_the_scripted_broker(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    topic = f"{topic_prefix}.roundtrip"
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        for i in range(20):
            await producer.send_and_wait(topic, f"v{i}".encode(), key=b"run-1")
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=kafka_bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(got) < 20 and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=1000)).values():
                got += [r.value for r in records]
    finally:
        await consumer.stop()
    assert got == [f"v{i}".encode() for i in range(20)]


def test_a_second_broker_reuses_the_jar_cache_and_stops_cleanly(tmp_path: Path) -> None:
    jar = kafka_home() / "lib" / "kafka_2.13-4.4.0.jar"
    assert jar.exists(), "make test fetches the jars before the tests run"
    before = jar.stat().st_mtime_ns
    broker = LocalKafka(state_dir=tmp_path / "k", port=free_port())
    broker.up()
    try:
        assert broker.status() == f"running on {broker.bootstrap} (pid {broker.pid()})"
    finally:
        broker.down()
    assert broker.status() == "stopped"
    assert jar.stat().st_mtime_ns == before  # no download the second time
    assert "Kafka Server started" in broker.log_file.read_text()


def test_chdb_through_clickhouse_connect(ch_client, ch_database: str) -> None:
    ch_client.command(
        f"CREATE TABLE {ch_database}.t (k UInt32, v Nullable(String)) ENGINE = MergeTree ORDER BY k"
    )
    ch_client.insert(f"{ch_database}.t", [[1, "a"], [2, None]], column_names=["k", "v"])
    rows = ch_client.query(f"SELECT k, v FROM {ch_database}.t ORDER BY k").result_rows
    assert rows == [(1, "a"), (2, None)]


def test_a_second_broker_on_a_live_state_directory_is_refused_and_the_first_keeps_working(
    tmp_path: Path,
) -> None:
    # Two JVMs on one KRaft metadata log corrupted it (CorruptRecordException): never again.
    state = tmp_path / "k"
    first = LocalKafka(state_dir=state, port=free_port())
    first.up()
    try:
        second = LocalKafka(state_dir=state, port=free_port())
        with pytest.raises(DevstackError) as refused:
            second.up(timeout=30)
        message = str(refused.value)
        assert f"a broker from {state} already runs (pid {first.pid()}, port {first.port})" in (
            message
        )
        assert "\n" not in message
        (state / "broker.pid").rename(state / "pid.aside")  # even without its pid file
        with pytest.raises(DevstackError, match="is locked by a running broker"):
            second.up(timeout=30)
        (state / "pid.aside").rename(state / "broker.pid")
        first.up()  # the same broker and port: reused, not restarted
        assert first.status().startswith("running on")
        assert "CorruptRecordException" not in first.log_file.read_text()
    finally:
        first.down()
