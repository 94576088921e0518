"""One event-time watermark across worker processes (schemas/CONTRACT.md rules 10 and 17).

Two workers share a group on a 4-partition topic. Every partition gets runs that never
send a terminal; then only one partition gets later events. The worker holding only quiet
partitions sees no event time move in its own input: its stale runs are marked
``incomplete`` by the other worker's progress alone (the lane-marks topic), at the same
event time as on the file path, where one clock sees every partition.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from prism.devstack.workerproc import wait_members
from prism.pipeline.replay._tail import partition_for
from prism.pipeline.topics import ensure_topics
from tests.fixtures.events import event_bytes, make_event
from tests.fixtures.kafka_io import produce
from tests.fixtures.oracle import subprocess_query
from tests.integration.test_faults_harness import FaultLab

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

PARTITIONS = 4
STALE_S = 600


def _runs_per_partition(per: int) -> dict[int, list[str]]:
    runs: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
    n = 0
    while any(len(v) < per for v in runs.values()):
        run_id = f"quiet-{n}"
        n += 1
        p = partition_for(run_id, PARTITIONS)
        if len(runs[p]) < per:
            runs[p].append(run_id)
    return runs


def _iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def test_a_worker_whose_partitions_went_quiet_marks_stale_runs_on_the_others_progress(
    lab: FaultLab, tmp_path: Path
) -> None:
    settings = {
        n: lab.settings(n, partitions=PARTITIONS, stale_run_seconds=STALE_S) for n in ("a", "b")
    }
    first = settings["a"]
    asyncio.run(ensure_topics(first))
    t0 = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=3)
    runs = _runs_per_partition(2)
    quiet = [r for rs in runs.values() for r in rs]
    started = [
        (run, event_bytes(make_event("agent_started", run, 0, envelope={"ts": _iso(t0)})))
        for run in quiet
    ]
    workers = {n: lab.worker(s, n) for n, s in settings.items()}
    wait_members(first.kafka_bootstrap_servers, first.consumer_group, 2, timeout=120)
    produce(first, started)  # once both hold partitions: each applies its own
    lab.drain(workers["a"], first, timeout=120, settle=2.0)

    # Later event time arrives on one partition only: one worker, at most, sees it.
    (late,) = [r for r in (f"late-{n}" for n in range(100)) if partition_for(r, PARTITIONS) == 0][
        :1
    ]
    later = t0 + timedelta(hours=2)
    produce(first, [(late, event_bytes(make_event("agent_started", late, 0,
                                                   envelope={"ts": _iso(later)})))])  # fmt: skip
    lab.drain(workers["a"], first, timeout=120, settle=1.0)
    # the workers' 1 s timers: the moved watermark reaches the quiet one through the
    # lane-marks topic, its next tick scans for stale runs (chDB has one owner per path,
    # so the ledgers are read once the workers stopped)
    time.sleep(10)
    for n, w in workers.items():
        assert w.running, f"{n} died:\n{w.tail_log()}"
    # both end at once: a worker stopped first would hand its lanes to the other, whose
    # own clock has the late mark, and the test would pass without the shared watermark
    for w in workers.values():
        w.kill()
    rows: dict[str, dict[str, Any]] = {}
    alerts: dict[str, str] = {}
    wrote = {}
    for n, s in settings.items():
        count, runs, stale = subprocess_query(s.clickhouse_dsn).many(
            [
                "SELECT count() AS n FROM prism.runs_store",
                "SELECT run_id, status, version FROM prism.runs",
                "SELECT key, toString(ts) AS ts FROM prism.alerts "
                "WHERE rule = 'stale_run' AND state = 'firing'",
            ]
        )
        wrote[n] = int(count[0]["n"])
        for r in runs:
            # folded as one server holds them: a run's newest version wins
            if int(r["version"]) >= int(rows.get(r["run_id"], {"version": -1})["version"]):
                rows[r["run_id"]] = r
        alerts.update({a["key"]: a["ts"] for a in stale})
    # each worker held partitions and wrote run rows of its own (the quiet one's are the
    # stale marks this test is about, whether it applied their events or restored them)
    assert all(v > 0 for v in wrote.values()), f"a worker held no partition: {wrote}"
    assert {r: rows[r]["status"] for r in quiet} == dict.fromkeys(quiet, "incomplete")
    assert rows[late]["status"] == "running"  # its own last event is the watermark
    # each fires at the event time the run went stale, as on the file path
    at = (t0 + timedelta(seconds=STALE_S)).strftime("%Y-%m-%d %H:%M:%S")
    assert {r: alerts[r][:19] for r in quiet} == dict.fromkeys(quiet, at)
