"""A zombie worker cannot change the state, the outputs or the offsets (rule 17).

Worker ``a`` is caught between its ledger insert and its Kafka transaction (the fault
``stall_after_insert``) and paused there (SIGSTOP) past its session timeout, so the group
hands its slots to ``b``, whose new producers fence ``a``'s. ``b`` drains everything.
Then ``a`` wakes up (SIGCONT) and tries to commit its batch: the transaction must fail
``Fenced``, nothing of it may become visible to readers (read committed), and ``a`` must
rejoin and work on. The two ledgers folded as one server would hold them equal the
manifest, and every closed run is on ``runs.closed`` exactly once.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from prism.devstack.workerproc import committed_lag
from prism.runtime.simulator import FleetConfig, simulate
from tests.fixtures.kafka_io import read_committed
from tests.fixtures.ledger_compare import merge_ledger
from tests.integration.test_faults_harness import (
    CHAOS,
    FaultLab,
    fault_lines,
    group_members,
    ledger_report,
)

pytestmark = [pytest.mark.integration]


def _stats(state_dir: Path) -> dict[str, Any]:
    path = state_dir / "worker-stats.json"
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):  # not written yet, or being replaced
        return {}


def _wait(what: str, check: Callable[[], object], timeout: float, lab: FaultLab) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.3)
    raise AssertionError(f"{what} did not happen in {timeout:.0f}s:\n{lab.tails()}")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_paused_worker_that_wakes_up_is_fenced_and_changes_nothing(lab: FaultLab) -> None:
    fleet = simulate(FleetConfig(runs=240, seed=87, **CHAOS))
    a, b = lab.settings("a"), lab.settings("b")
    half = len(fleet.records) // 2
    lab.publish(fleet, a, fleet.records[:half])
    wa = lab.worker(a, "a", faults="stall_after_insert:2")
    _wait("a's stall", lambda: fault_lines(wa), 90, lab)
    assert wa.proc is not None
    os.kill(wa.proc.pid, signal.SIGSTOP)  # a zombie, between its insert and its commit
    try:
        wb = lab.worker(b, "b")
        lab.publish(fleet, a, fleet.records[half:])
        lab.drain(wb, a, settle=2.0)  # b took every slot over and committed it all
        assert _stats(b.state_dir).get("slots") == list(range(a.partitions))
    finally:
        os.kill(wa.proc.pid, signal.SIGCONT)
    _wait("a's fenced commit", lambda: _stats(a.state_dir).get("fenced_writes", 0), 60, lab)
    log = wa.log_path.read_text(errors="replace")
    assert "its batch is left to the slot's new owner" in log, lab.tails()
    _wait("a rejoining", lambda: group_members(a)[1] == 2, 60, lab)
    lag, total = committed_lag(a.kafka_bootstrap_servers, a.consumer_group, a.topics.input)
    assert (lag, total) == (0, len(fleet.records)), lab.tails()
    lab.drain(wb, a, settle=2.0)
    assert wa.stop() == 0 and wb.stop() == 0

    # read committed: the zombie's batch left no output; each run closed once
    closed = Counter(r.key for r in read_committed(a, a.topics.runs_closed))
    assert closed and max(closed.values()) == 1, closed.most_common(3)
    merge_ledger(src_dsn=b.clickhouse_dsn, dst_dsn=a.clickhouse_dsn, tmp=lab.tmp)
    problems = ledger_report(a, lab.tmp).problems(fleet.manifest)
    assert problems == [], "\n".join(problems)
