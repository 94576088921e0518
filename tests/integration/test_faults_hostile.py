"""Hostile fleets and poison records through the real broker and the real worker.

A hostile fleet (reordering across terminals, late tenants, a producer clock in 2199,
another tenant reusing run ids, resent usage, runs on partitions that go quiet) gives the
manifest's ledger through Kafka, and the same ledger as ``ingest-file``. A record the
ledger refuses for good, and the event that would make a run's state outgrow a changelog
record, are dead-lettered ``unstorable`` and their partitions keep flowing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import orjson
import pytest

from prism.runtime.simulator import FleetConfig, simulate
from tests.integration.test_faults_harness import FaultLab, ledger_report, read_topic

pytestmark = [pytest.mark.integration]

PARTITIONS = 4


@pytest.mark.timeout(420)
def test_a_hostile_fleet_gives_the_manifest_through_kafka_and_the_file_path(lab: FaultLab) -> None:
    fleet = simulate(FleetConfig(runs=160, seed=1130, hostile=0.25, duplicates=0.03,
                                 reorder_window=3, post_terminal=0.04, malformed=0.02,
                                 partitions=PARTITIONS))  # fmt: skip
    injected = fleet.manifest["injected"]
    assert fleet.manifest["quarantine"]["tenant_mismatch"] > 0, injected
    assert any(row["clock_skew"] for row in fleet.manifest["runs"].values()), injected
    s = lab.settings("w", partitions=PARTITIONS)
    lab.publish(fleet, s)
    w = lab.worker(s, "w")
    lab.drain(w, s, settle=4.0)
    assert w.stop() == 0
    report = ledger_report(s, lab.tmp)
    problems = report.problems(fleet.manifest)
    assert problems == [], "\n".join(problems)

    jsonl = lab.tmp / "fleet.jsonl"
    jsonl.write_bytes(b"\n".join(r.value for r in fleet.records) + b"\n")
    f = lab.settings("file")
    out = subprocess.run(
        [sys.executable, "-m", "prism.pipeline.cli", "ingest-file", str(jsonl),
         "--clickhouse", f.clickhouse_dsn.get_secret_value(), "--no-progress"],
        capture_output=True, text=True, timeout=300, check=False, env=dict(os.environ),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    by_file = dict(ledger_report(f, lab.tmp).contents)
    by_kafka = dict(report.contents)
    for contents in (by_file, by_kafka):
        contents.pop("dead_letters")  # keyed by Kafka offset or by line number
    assert by_kafka == by_file


@pytest.mark.timeout(300)
def test_poison_records_are_dead_lettered_and_their_partitions_keep_flowing(
    lab: FaultLab,
) -> None:
    """Two kinds of poison in one fleet: a record the ledger refuses for good, and a run
    whose valid 700 KB events would make a state no changelog record can hold (the one
    that would make it so is cut). Each is dead-lettered ``unstorable``; all else is stored."""
    from prism.runtime.simulator import FleetRecord
    from tests.fixtures.runs import RunBuilder

    fleet = simulate(FleetConfig(runs=60, seed=4, partitions=PARTITIONS))
    poison = next(
        r for r in fleet.records if r.event is not None and r.event["type"] == "tool_call_finished"
    )
    poison_id = poison.event["eventId"]
    b = RunBuilder("big-run").started()
    for _ in range(3):
        b.add("custom.blob", {"notes": "x" * 700_000})
    b.finished()
    now_ms = int(time.time() * 1000)
    big = [FleetRecord(b"big-run", orjson.dumps(e), (), "valid", now_ms, e) for e in b.events]
    s = lab.settings("w", partitions=PARTITIONS)
    lab.publish(fleet, s, records=fleet.records + big)
    w = lab.worker(s, "w", faults=f"refuse_event:{poison_id}")
    lab.drain(w, s)
    assert w.running, w.tail_log()
    assert "refuse_event" in w.tail_log()
    assert w.stop() == 0
    report = ledger_report(s, lab.tmp)
    dead = read_topic(s, s.topics.dlq)

    # the refused record
    assert poison_id not in report.event_ids
    dlq = [m for m in dead if m.value == poison.value]
    assert len(dlq) == 1, "the poison record is on the DLQ once"
    headers = {k: v.decode() for k, v in dlq[0].headers}
    assert headers["reason-code"] == "unstorable" and "refus" in headers["reason"]
    where = (int(headers["source-partition"]), int(headers["source-offset"]))
    assert report.dead_letters[where][0] == "unstorable"
    later = [
        m for m in read_topic(s, s.topics.input) if m.partition == where[0] and m.offset > where[1]
    ]
    assert later and any(
        orjson.loads(m.value)["eventId"] in report.event_ids for m in later if m.value
    )

    # the run outgrowing a changelog record: cut at the event that would make it so
    dlq = [m for m in dead if m.key == b"big-run"]
    assert [m.value for m in dlq] == [big[3].value]
    headers = {k: v.decode() for k, v in dlq[0].headers}
    assert headers["reason-code"] == "unstorable" and "changelog record" in headers["reason"]
    assert {e["eventId"] for e in b.events} - report.event_ids == {b.events[3]["eventId"]}

    # everything else arrived: every other applied event of the fleet is in the ledger
    assert report.events == fleet.manifest["counts"]["applied_events"] - 1 + len(big) - 1
