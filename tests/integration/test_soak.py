"""A short chaos soak (``make soak`` in small): faults at seeded times, the ledger stays exact.

The soak runs as the user runs it, in a process of its own, with its own 3-broker cluster
on free ports: 3 workers over 12 partitions, a fleet offered for under a minute with a
share of it published under other keys, and the seeded faults that fit in that time
(seed 2: a worker SIGKILLed and restarted, then the limit-deaths holder).
The verdict it writes must pass, and its figures are checked one by one: a failing soak
prints what differed (runs, events, partitions) in the test's output.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from prism.devstack.soak import long_lived

pytestmark = [pytest.mark.integration, pytest.mark.soak]

MINUTES = 0.75
SEED = 2


@pytest.mark.timeout(720)
def test_a_short_chaos_soak_loses_and_doubles_nothing(tmp_path: Path) -> None:
    # The drain has the soak's own bounds: it fails once the group makes no progress for
    # the stall bound (45 s), not after a fixed time, so a slow machine that drains
    # steadily passes and a stuck group still fails within a minute of sticking.
    verdict_path, log = tmp_path / "verdict.json", tmp_path / "soak.log"
    args = ["--minutes", str(MINUTES), "--seed", str(SEED), "--rate", "1000"]
    args += ["--state-dir", str(tmp_path / "soak")]
    with open(log, "wb") as out:
        soak = subprocess.Popen(
            [sys.executable, "-m", "prism.devstack.soak", *args, "--json", str(verdict_path)],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            soak.wait(600)
        except subprocess.TimeoutExpired:
            pass
        finally:
            if soak.poll() is None:
                soak.send_signal(signal.SIGTERM)  # the soak stops its brokers and workers
                soak.wait(120)
    output = log.read_text(errors="replace")[-8000:]
    print(output)
    assert verdict_path.exists(), f"the soak wrote no verdict (exit {soak.returncode}):\n{output}"
    v = json.loads(verdict_path.read_text())
    assert v["failures"] == [], output
    assert v["ok"] and soak.returncode == 0
    # the ledger folded from every worker equals the manifest, check by check
    names = {c["name"] for c in v["checks"] if c["ok"] and c["compared"]}
    for name in ("runs by status", "run records", "billable usage", "reported cost",
                 "dead letters by reason", "quarantine by reason", "events applied"):  # fmt: skip
        assert name in names, (name, v["checks"])
    assert all(c["ok"] for c in v["checks"])
    assert (v["lost"], v["doubled"], v["unexpected"]) == (0, 0, 0)
    assert v["offsets_accounted"] and sum(v["end_offsets"].values()) == v["published"]
    assert sum(v["foreign_keys"].values()) > 0  # some records went out under other keys
    # the faults happened and the group recovered from each within the bounds
    assert any("SIGKILLed, restarted" in a for a in v["actions"]), v["actions"]
    assert v["rebalances_kept"] >= v["min_rebalances_kept"] >= 1
    assert v["longest_stall_s"] < v["stall_bound_s"] == 45
    assert v["recoveries"] and all(r["s"] is not None for r in v["recoveries"])
    assert v["worker_exits"] == [] and set(v["exit_codes"].values()) == {0}
    for name, w in v["workers"].items():  # each worker reports what the verdict prints
        assert w["peak_rss_mb"] > 0, name
        assert isinstance(w["fenced_writes"], int), (name, w)
        assert isinstance(w["state_restore_s"], list), (name, w)
        if long_lived(name):  # a fourth may leave before restoring
            assert w["state_restore_s"], (name, w)
