"""A chaotic simulated fleet through the real broker and the worker equals its ground truth.

And the same fleet through ``ingest-file`` gives the same ledger; and a second worker
joining mid-stream (a rebalance) changes nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from prism.devstack.workerproc import WorkerProcess, committed_positions, wait_members
from prism.pipeline.settings import load_settings
from prism.pipeline.topics import ensure_topics, worker_env
from prism.runtime.simulator import FleetConfig, publish_to_kafka, simulate, write_jsonl
from tests.fixtures.ledger_compare import ledger_contents, merge_ledger
from tests.fixtures.oracle import diff_manifest, snapshot, subprocess_query

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

CHAOS = dict(
    duplicates=0.05,
    reorder_window=3,
    post_terminal=0.04,
    conflicting_terminals=0.03,
    malformed=0.02,
    oversized=0.004,
)


@pytest.fixture(scope="module")
def fleet():
    return simulate(FleetConfig(runs=400, seed=20261130, **CHAOS))


def _settings(kafka_bootstrap: str, prefix: str, tmp: Path, name: str):
    (tmp / name).mkdir(parents=True, exist_ok=True)  # a chDB path's parent must exist
    return load_settings(
        kafka_bootstrap_servers=kafka_bootstrap,
        topic_prefix=prefix,
        consumer_group=f"{prefix}-group",
        clickhouse_dsn=f"chdb://{tmp / name / 'ledger'}",
        state_dir=tmp / name / "state",
        state_store="memory",
        grace_period_seconds=1.0,
        batch_max_events=1000,
        batch_max_seconds=0.3,
    )


def _publish(fleet, settings, records=None):
    sub = fleet if records is None else dataclasses.replace(fleet, records=records)
    asyncio.run(ensure_topics(settings))
    asyncio.run(
        publish_to_kafka(
            sub, settings.kafka_bootstrap_servers, settings.topics.input, progress=False
        )
    )


def test_fleet_through_kafka_matches_manifest_and_file_replay(
    fleet, kafka_bootstrap, topic_prefix, tmp_path
):
    s = _settings(kafka_bootstrap, topic_prefix, tmp_path, "live").model_copy(
        update={"progress_interval_seconds": 1.0}
    )
    _publish(fleet, s)
    with WorkerProcess(worker_env(s), log_path=tmp_path / "live.log") as w:
        w.wait_drained(s.topics.input, s.consumer_group, settle=4.0)
        ends = committed_positions(s.kafka_bootstrap_servers, s.consumer_group, s.topics.input)
    live = subprocess_query(s.clickhouse_dsn)
    problems = diff_manifest(snapshot(live, "prism"), fleet.manifest)
    assert problems == [], "\n".join(problems)
    # The worker sampled its position: at the end every partition is stored to its end.
    samples = live(
        "SELECT partition, argMax(processed, ts) AS processed, argMax(end_offset, ts) AS end, "
        "argMax(lag, ts) AS lag, count() AS n FROM prism.worker_progress GROUP BY partition"
    )
    assert {r["partition"]: (r["processed"], r["end"], r["lag"]) for r in samples} == {
        p: (end, end, 0) for p, (_, end) in ends.items() if end > 0
    }
    assert all(r["n"] >= 2 for r in samples), samples

    path = tmp_path / "fleet.jsonl"
    write_jsonl(fleet, path)
    (tmp_path / "file").mkdir()
    file_dsn = f"chdb://{tmp_path / 'file' / 'ledger'}"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "prism.pipeline.cli",
            "ingest-file",
            str(path),
            "--clickhouse",
            file_dsn,
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "runs by status" in out.stdout
    replay = subprocess_query(file_dsn)
    assert diff_manifest(snapshot(replay, "prism"), fleet.manifest) == []
    assert ledger_contents(live, "prism") == ledger_contents(replay, "prism")


def test_second_worker_joining_mid_stream_keeps_the_ledger_exact(
    fleet, kafka_bootstrap, topic_prefix, tmp_path
):
    a = _settings(kafka_bootstrap, topic_prefix, tmp_path, "a")
    b = _settings(kafka_bootstrap, topic_prefix, tmp_path, "b")
    half = len(fleet.records) // 2
    _publish(fleet, a, fleet.records[:half])
    with WorkerProcess(worker_env(a), log_path=tmp_path / "a.log") as wa:
        wa.wait_drained(a.topics.input, a.consumer_group, settle=1.0)
        with WorkerProcess(worker_env(b), log_path=tmp_path / "b.log") as wb:
            wait_members(kafka_bootstrap, a.consumer_group, 2)
            _publish(fleet, a, fleet.records[half:])
            wb.wait_drained(a.topics.input, a.consumer_group, settle=4.0)
            assert wa.running and wb.running
    b_rows = subprocess_query(b.clickhouse_dsn)("SELECT count() AS n FROM prism.run_events")
    assert b_rows[0]["n"] > 0, "the second worker was never assigned a partition"
    # Two embedded engines cannot share files: fold b's rows into a's ledger, as one server would.
    merge_ledger(src_dsn=b.clickhouse_dsn, dst_dsn=a.clickhouse_dsn, tmp=tmp_path)
    problems = diff_manifest(snapshot(subprocess_query(a.clickhouse_dsn), "prism"), fleet.manifest)
    assert problems == [], "\n".join(problems)
