"""A fleet with channel traffic through Kafka and through ``ingest-file`` gives the manifest's
truth and the same channel ledger both ways; a worker SIGKILLed mid-stream changes nothing.

One small fleet (agent events with guardrail denials, and channel operations with every
failure mode of the seeds) serves every case; ledgers are read in child processes, since a
chDB engine path belongs to one process at a time.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from prism.devstack.workerproc import WorkerProcess, committed_lag
from prism.pipeline.settings import Settings
from prism.runtime.simulator import FleetConfig, simulate, write_jsonl
from tests.integration.test_faults_harness import FaultLab

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

FLEET = FleetConfig(
    runs=40, seed=1717, duplicates=0.02, reorder_window=2, guardrail_denials=0.1,
    channel_operations=150,
)  # fmt: skip
CHANNEL_VIEWS = ("channel_operations", "channel_open_items", "channel_denials",
                 "channel_quarantine", "guardrail_denials")  # fmt: skip

# Runs in a child: every truth check (runs, usage, rejects, guardrails, channels) and the
# channel views' rows, pickled to the path given.
_LOOK = """
import pickle, sys
from prism import sinks
from prism.devstack._truth import compare
dsn, manifest_path, out, names, db = sys.argv[1:6]
manifest = pickle.load(open(manifest_path, "rb"))
client = sinks.connect(dsn, db)
checks = compare(client, db, manifest)
views = {v: sorted(repr(tuple(r)) for r in client.query(
    f"SELECT * EXCEPT (source, partition, offset, received_at) FROM {db}.{v}"
    if v == "channel_quarantine" else f"SELECT * FROM {db}.{v}").result_rows)
    for v in names.split(",")}
pickle.dump({"failed": {c.name: c.problems[:5] for c in checks if not c.ok},
             "compared": {c.name: c.compared for c in checks}, "views": views}, open(out, "wb"))
"""


@pytest.fixture(scope="module")
def fleet():
    return simulate(FLEET)


def look(dsn: str, manifest: dict[str, Any], tmp: Path, db: str = "prism") -> dict[str, Any]:
    stamp = time.monotonic_ns()
    manifest_path, out = tmp / f"manifest-{stamp}.pickle", tmp / f"look-{stamp}.pickle"
    manifest_path.write_bytes(pickle.dumps(manifest))
    proc = subprocess.run(
        [sys.executable, "-c", _LOOK, dsn, str(manifest_path), str(out), ",".join(CHANNEL_VIEWS),
         db],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return pickle.loads(out.read_bytes())  # type: ignore[no-any-return]


def drain_both(lab: FaultLab, w: WorkerProcess, s: Settings) -> None:
    """The agent-event topic drained (``lab.drain``), then the channel topic too."""
    lab.drain(w, s, settle=1.0)
    deadline = time.monotonic() + 60
    while committed_lag(s.kafka_bootstrap_servers, s.consumer_group,
                        s.topics.channel_operations)[0]:  # fmt: skip
        assert time.monotonic() < deadline and w.running, w.tail_log(30)
        time.sleep(0.5)
    lab.drain(w, s, settle=3.0)  # the 1 s timer flags stuck operations at the last watermark


def test_channel_fleet_through_kafka_and_ingest_file_equals_the_manifest(
    lab: FaultLab, fleet, tmp_path: Path
) -> None:
    s = lab.settings("live", channel_stuck_seconds=FLEET.channel_stuck_seconds)
    lab.publish(fleet, s)
    w = lab.worker(s, "live")
    drain_both(lab, w, s)
    assert w.stop() == 0
    live = look(s.clickhouse_dsn.get_secret_value(), fleet.manifest, tmp_path)
    assert live["failed"] == {}, json.dumps(live["failed"], indent=1, default=str)
    for name in ("channel operations", "channel open items", "channel stuck operations",
                 "channel denials", "channel quarantine", "guardrail denials"):  # fmt: skip
        assert live["compared"][name] > 0, name

    # tail --operation: a delivered operation ends (0); an open item waits for a reconcile (3)
    ops = fleet.manifest["channels"]["operations"]
    done = next(o for o, op in ops.items() if op["state"] == "delivered" and op["transitions"] == 3)
    waiting = fleet.manifest["channels"]["open_items"][0]["operation_id"]
    base = [sys.executable, "-m", "prism.pipeline.cli", "tail", "--format", "pretty",
            "--bootstrap", s.kafka_bootstrap_servers, "--topic-prefix", s.topic_prefix]  # fmt: skip
    out = subprocess.run([*base, "--operation", done, "--timeout", "30"], capture_output=True,
                         text=True, timeout=60, check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert [line.split()[2] for line in out.stdout.splitlines()] == [
        "admitted", "executing", "delivered"
    ]  # fmt: skip
    out = subprocess.run([*base, "--operation", waiting, "--timeout", "2"], capture_output=True,
                         text=True, timeout=60, check=False)  # fmt: skip
    assert out.returncode == 3, out.stderr[-2000:]
    assert f"operation {waiting}: not finished, last state " in out.stderr

    # rebuild reads both topics into a new database of the same ledger
    dsn = s.clickhouse_dsn.get_secret_value()
    out = subprocess.run(
        [sys.executable, "-m", "prism.pipeline.cli", "rebuild", "--clickhouse", dsn,
         "--database", "prism_rebuilt", "--bootstrap", s.kafka_bootstrap_servers,
         "--topic-prefix", s.topic_prefix, "--no-progress"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"from {s.topics.input} + {s.topics.channel_operations}" in out.stdout, out.stdout
    rebuilt = look(dsn, fleet.manifest, tmp_path, "prism_rebuilt")
    assert rebuilt["failed"] == {}, json.dumps(rebuilt["failed"], indent=1, default=str)
    assert rebuilt["views"] == live["views"]

    path = tmp_path / "fleet.jsonl"
    write_jsonl(fleet, path)
    (tmp_path / "file").mkdir()
    file_dsn = f"chdb://{tmp_path / 'file' / 'ledger'}"
    out = subprocess.run(
        [sys.executable, "-m", "prism.pipeline.cli", "ingest-file", str(path),
         "--clickhouse", file_dsn, "--no-progress"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    channel = fleet.manifest["channels"]["counts"]
    assert f"channel records: {channel['unique_records']} " in out.stdout, out.stdout
    replay = look(file_dsn, fleet.manifest, tmp_path)
    assert replay["failed"] == {}, json.dumps(replay["failed"], indent=1, default=str)
    assert replay["views"] == live["views"]
    assert len(live["views"]["channel_open_items"]) == len(fleet.manifest["channels"]["open_items"])


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["kill_after_insert:2"])
def test_a_worker_killed_mid_stream_with_channel_traffic_loses_and_doubles_nothing(
    lab: FaultLab, fleet, tmp_path: Path, fault: str
) -> None:
    s = lab.settings("w", store="rocksdb", channel_stuck_seconds=FLEET.channel_stuck_seconds)
    lab.publish(fleet, s)
    lines = lab.wait_killed(lab.worker(s, "killed", faults=fault))
    assert [ln for ln in lines if ln.startswith(fault.split(":")[0])], lines
    restarted = lab.worker(s, "restarted")
    drain_both(lab, restarted, s)
    assert restarted.stop() == 0
    after = look(s.clickhouse_dsn.get_secret_value(), fleet.manifest, tmp_path)
    assert after["failed"] == {}, json.dumps(after["failed"], indent=1, default=str)
