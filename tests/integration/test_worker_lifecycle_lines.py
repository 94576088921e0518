"""A worker subprocess reports its drain (lag callbacks) and logs one summary line on SIGTERM."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from prism.devstack.workerproc import WorkerProcess
from prism.pipeline.settings import load_settings
from prism.pipeline.topics import ensure_topics, worker_env
from prism.runtime.simulator import FleetConfig, publish_to_kafka, simulate

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_drain_progress_and_the_stop_summary(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    settings = load_settings(
        kafka_bootstrap_servers=kafka_bootstrap,
        topic_prefix=topic_prefix,
        consumer_group=f"{topic_prefix}-g",
        clickhouse_dsn=f"chdb://{tmp_path / 'ledger'}",
        state_dir=tmp_path / "state",
        state_store="memory",
        grace_period_seconds=1.0,
    )
    fleet = simulate(FleetConfig(runs=30, seed=5, malformed=0.1))
    asyncio.run(ensure_topics(settings))
    asyncio.run(publish_to_kafka(fleet, kafka_bootstrap, settings.topics.input, progress=False))
    seen: list[tuple[int, int]] = []
    log = tmp_path / "worker.log"
    with WorkerProcess(worker_env(settings), log_path=log) as worker:
        worker.wait_drained(
            settings.topics.input,
            settings.consumer_group,
            timeout=180,
            on_progress=lambda lag, total: seen.append((lag, total)),
        )
    assert worker.proc is not None and worker.proc.returncode == 0
    assert seen[-1] == (0, len(fleet.records))
    assert all(total == len(fleet.records) for _, total in seen)

    (line,) = [ln for ln in log.read_text().splitlines() if "worker stopping:" in ln]
    dlq = sum(fleet.manifest["dlq"].values())
    assert f"consumed {len(fleet.records):,} events in " in line
    assert re.search(rf"lag 0, freshness p50 \S+ p99 \S+, DLQ {dlq} \(", line), line
