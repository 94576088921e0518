"""Every run in one place, whatever the producer's key (CONTRACT.md, Transport; rule 15).

A fleet is published by a mix of producers that do not key by ``runId`` the way the
contract asks: event-id keys, null keys (aiokafka spreads them at random), and a client
whose partitioner hashes differently (librdkafka's CRC32), each record on whatever
partition its producer picked. Through one worker, and through two with their ledgers
folded as one server would hold them, the ledger and the exhaustion alerts must be the
file path's (``ingest-file`` of the same records), every forwarded offset accounted for,
and each producer pattern named once in the worker's log.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import time
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from prism.devstack.workerproc import committed_lag
from prism.pipeline.core import home_partition
from prism.pipeline.core._route import CRC32_PATTERN, NULL_KEY, OTHER_KEY
from prism.pipeline.settings import Settings
from prism.runtime.simulator import FleetConfig, simulate, write_jsonl
from tests.fixtures.ledger_compare import ledger_contents, merge_ledger
from tests.fixtures.oracle import subprocess_query
from tests.integration.test_faults_harness import CHAOS, FaultLab, ledger_report

pytestmark = [pytest.mark.integration]

PATTERNS = ("eventId key", "null key", "crc32", "home")


@pytest.fixture(scope="module")
def fleet() -> Any:
    return simulate(FleetConfig(runs=300, seed=88, **CHAOS))


@pytest.fixture(scope="module")
def file_ledger(fleet: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The file path's ledger of the fleet: the truth the worker must reproduce."""
    tmp = tmp_path_factory.mktemp("file")
    path = tmp / "fleet.jsonl"
    write_jsonl(fleet, path)
    dsn = f"chdb://{tmp / 'ledger'}"
    out = subprocess.run(
        [sys.executable, "-m", "prism.pipeline.cli", "ingest-file", str(path),
         "--clickhouse", dsn, "--no-progress"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return dsn


def _publish_foreign(fleet: Any, s: Settings, seed: int) -> Counter[str]:
    """Publish every record as one of ``PATTERNS`` would; how many each took."""
    rng = random.Random(seed)
    used: Counter[str] = Counter()

    async def go() -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=s.kafka_bootstrap_servers, enable_idempotence=True, acks="all",
            linger_ms=20, max_request_size=4 * 1_048_576,
        )  # fmt: skip
        await producer.start()
        try:
            futures = []
            for r in fleet.records:
                topic = s.topics.input if r.family == "agent" else s.topics.channel_operations
                pattern = rng.choice(PATTERNS)
                used[pattern] += 1
                key: bytes | None = r.key
                partition: int | None = None
                if pattern == "eventId key":
                    key = str((r.event or {}).get("eventId", r.key)).encode()
                elif pattern == "null key":
                    key = None
                elif pattern == "crc32":  # librdkafka's consistent_random on the runId key
                    partition = zlib.crc32(r.key) % s.partitions
                fut = await producer.send(
                    topic, r.value, key=key, partition=partition, headers=list(r.headers)
                )
                futures.append(fut)
            await asyncio.gather(*futures)
        finally:
            await producer.stop()

    asyncio.run(go())
    return used


def _stats(s: Settings) -> dict[str, Any]:
    return dict(json.loads((s.state_dir / "worker-stats.json").read_text()))


def _check(lab: FaultLab, s: Settings, fleet: Any, file_ledger: str, logs: list[Path]) -> None:
    report = ledger_report(s, lab.tmp)
    problems = report.problems(fleet.manifest)
    assert problems == [], "\n".join(problems)
    live, replay = subprocess_query(s.clickhouse_dsn), subprocess_query(file_ledger)
    assert ledger_contents(live, "prism") == ledger_contents(replay, "prism")
    alerts = "SELECT alert_id, rule, state FROM prism.alerts ORDER BY alert_id, state"
    assert live(alerts) == replay(alerts)
    text = "\n".join(p.read_text(errors="replace") for p in logs)
    for pattern in (NULL_KEY, OTHER_KEY, CRC32_PATTERN):  # each named, once per process
        said = text.count(f"records off their run's home partition ({pattern})")
        assert 1 <= said <= len(logs), (pattern, said)


def _drain_repartition(lab: FaultLab, s: Settings, timeout: float = 60.0) -> None:
    """Wait until the group committed both repartition topics to their ends."""
    deadline = time.monotonic() + timeout
    for topic in (s.topics.repartition, s.topics.channel_repartition):
        while True:
            lag, _ = committed_lag(s.kafka_bootstrap_servers, s.consumer_group, topic)
            if lag == 0:
                break
            assert time.monotonic() < deadline, f"{topic} lag {lag}:\n{lab.tails()}"
            time.sleep(0.5)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_fleet_keyed_any_which_way_gives_the_file_paths_ledger_on_one_worker(
    lab: FaultLab, fleet: Any, file_ledger: str
) -> None:
    s = lab.settings("w")
    used = _publish_foreign(fleet, s, seed=1)
    assert min(used.values()) > 100, used
    w = lab.worker(s, "w")
    lab.drain(w, s, settle=3.0)
    _drain_repartition(lab, s)
    forwarded = sum(_stats(s).get("forwarded", {}).values())
    assert w.stop() == 0
    # about three quarters of the records are off home (all but the runId-keyed ones and
    # those that land home by chance); only records that parse are forwarded
    valid = sum(1 for r in fleet.records if r.kind == "valid")
    assert valid // 2 < forwarded < valid, (forwarded, valid)
    _check(lab, s, fleet, file_ledger, [w.log_path])


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_fleet_keyed_any_which_way_gives_the_file_paths_ledger_on_two_workers(
    lab: FaultLab, fleet: Any, file_ledger: str
) -> None:
    a, b = lab.settings("a"), lab.settings("b")
    _publish_foreign(fleet, a, seed=2)
    wa, wb = lab.worker(a, "a"), lab.worker(b, "b")
    lab.drain(wa, a, settle=3.0)
    _drain_repartition(lab, a)
    assert _stats(a).get("slots") and _stats(b).get("slots"), lab.tails()
    assert wa.stop() == 0 and wb.stop() == 0
    merge_ledger(src_dsn=b.clickhouse_dsn, dst_dsn=a.clickhouse_dsn, tmp=lab.tmp)
    _check(lab, a, fleet, file_ledger, [wa.log_path, wb.log_path])


def test_the_home_partition_is_the_java_clients() -> None:
    """The publisher of this project keys by runId with aiokafka's default partitioner:
    the records it publishes are already home and never take the hop."""
    from aiokafka.partitioner import DefaultPartitioner

    part = DefaultPartitioner()
    for i in range(200):
        key = f"run_{i:04d}".encode()
        assert home_partition(key, 12) == part(key, list(range(12)), list(range(12)))
