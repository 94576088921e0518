"""Several workers in one consumer group on a 12-partition topic; one killed, one added mid-stream.

Three worker subprocesses share a group; while the fleet flows, one is SIGKILLed (its
partitions move to the others after the session timeout, its uncommitted batch is
delivered again) and a fourth joins. Each worker writes its own embedded ledger (chDB has
one owner per path); folded together, as one ClickHouse server would hold them, they
equal the simulator's manifest. Every worker must have applied events of its own.
"""

from __future__ import annotations

import asyncio
import json
import re
import time

import pytest

from prism.devstack.workerproc import wait_members
from prism.pipeline.settings import Settings
from prism.pipeline.topics import ensure_topics
from prism.runtime.simulator import FleetConfig, simulate
from tests.fixtures.flow import Flow
from tests.fixtures.ledger_compare import merge_ledger
from tests.fixtures.oracle import subprocess_query
from tests.integration.test_faults_harness import CHAOS, FaultLab, ledger_report

pytestmark = [pytest.mark.integration]

COUNT = "SELECT count() AS n FROM prism.run_events_store"
CRASH = re.compile(r"Crashed reason=[^\n]*")


def _wait_applied(settings: Settings, timeout: float) -> None:
    """Wait until the worker's stats file says it applied events (stored in its ledger)."""
    path = settings.state_dir / "worker-stats.json"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if json.loads(path.read_text()).get("applied", 0) > 0:
                return
        except (OSError, ValueError):
            pass  # not written yet, or caught mid-rewrite
        time.sleep(0.2)
    raise AssertionError(f"{path.parent.parent.name} applied nothing within {timeout:.0f}s")


@pytest.mark.timeout(420)
def test_three_workers_one_killed_one_added_keep_the_ledger_exact(lab: FaultLab) -> None:
    fleet = simulate(FleetConfig(runs=600, seed=1404, **CHAOS))
    names = ["w1", "w2", "w3", "w4"]
    settings = {n: lab.settings(n, partitions=12) for n in names}
    first = settings["w1"]
    group = first.consumer_group
    asyncio.run(ensure_topics(first))
    third = len(fleet.records) // 3
    lab.publish(fleet, first, fleet.records[:third])

    workers = {n: lab.worker(settings[n], n) for n in names[:3]}
    started = time.monotonic()
    wait_members(first.kafka_bootstrap_servers, group, 3, timeout=120)
    joined = time.monotonic() - started

    # The middle third flows while a worker dies and another joins.
    flow = Flow(
        fleet.records[third : 2 * third], first.kafka_bootstrap_servers, first.topics.input,
        pace=third / 90,
    )  # fmt: skip
    _wait_applied(settings["w2"], timeout=90)  # the worker about to die has work of its own
    workers["w2"].kill()
    killed = time.monotonic()
    wait_members(first.kafka_bootstrap_servers, group, 2, timeout=60)
    regrouped = time.monotonic() - killed
    workers["w4"] = lab.worker(settings["w4"], "w4")
    added = time.monotonic()
    wait_members(first.kafka_bootstrap_servers, group, 3, timeout=120)
    rejoined = time.monotonic() - added
    assert flow.flowing, "the middle third was sent before the group changed; lower the pace"
    assert flow.join() == third
    lab.publish(fleet, first, fleet.records[2 * third :])

    lab.drain(workers["w1"], first, timeout=180, settle=3.0)
    for n in ("w1", "w3", "w4"):
        assert workers[n].running, f"{n} died:\n{workers[n].tail_log()}"
        assert workers[n].stop() == 0
    # A worker that hits an unexpected error stops without committing (exit 70) and is
    # restarted by its supervisor; it is still a defect, so any crash fails here.
    crashes = {n: CRASH.findall(w.log_path.read_text(errors="replace")) for n, w in workers.items()}
    assert not any(crashes.values()), f"stream agents crashed: {crashes}"
    applied = {n: int(subprocess_query(settings[n].clickhouse_dsn)(COUNT)[0]["n"]) for n in names}
    assert all(applied[n] > 0 for n in names), f"a worker never applied an event: {applied}"
    for n in names[1:]:
        merge_ledger(src_dsn=settings[n].clickhouse_dsn, dst_dsn=first.clickhouse_dsn, tmp=lab.tmp)
    problems = ledger_report(first, lab.tmp).problems(fleet.manifest)
    assert problems == [], "\n".join(problems)
    print(
        f"{len(fleet.records):,} records on 12 partitions; 3 workers stable after {joined:.1f}s; "
        f"SIGKILLed w2 left the group after {regrouped:.1f}s; w4 joined in {rejoined:.1f}s; "
        f"events applied per worker ledger {applied}"
    )
