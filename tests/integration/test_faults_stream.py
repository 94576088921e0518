"""Fault injection on the stream: broker restart, duplicates and reordering, a worker joining
and leaving, bad records.

Each case runs real worker subprocesses on a real broker and an embedded chDB ledger and
ends with the oracle: the ledger equals the simulator's manifest.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from prism.devstack.workerproc import committed_lag
from prism.pipeline.settings import Settings
from prism.runtime.simulator import FleetConfig, simulate
from tests.fixtures.ledger_compare import merge_ledger
from tests.integration.test_faults_harness import (
    CHAOS,
    FaultLab,
    fault_lines,
    group_members,
    ledger_report,
    read_topic,
)

pytestmark = [pytest.mark.integration]


@pytest.fixture
def own_broker_lab(topic_prefix: str, tmp_path: Path) -> Iterator[FaultLab]:
    """A lab whose broker this test alone starts, stops and restarts."""
    lab = FaultLab("", topic_prefix, tmp_path)
    try:
        yield lab
    finally:
        lab.close()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_broker_stop_and_restart_while_events_flow(own_broker_lab: FaultLab) -> None:
    lab = own_broker_lab
    broker = lab.broker()
    fleet = simulate(FleetConfig(runs=200, seed=81, **CHAOS))
    s = lab.settings("w", bootstrap=broker.bootstrap)
    half = len(fleet.records) // 2
    lab.publish(fleet, s, fleet.records[:half])
    w = lab.worker(s, "w")
    # Take the broker away as soon as the worker has committed its first offsets.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            lag, _ = committed_lag(broker.bootstrap, s.consumer_group, s.topics.input)
        except Exception:  # the group does not exist yet
            lag = half
        if lag < half:
            break
        assert w.running, w.tail_log()
        time.sleep(0.2)
    broker.down()
    time.sleep(5)
    broker.up()
    lab.publish(fleet, s, fleet.records[half:])
    lab.drain(w, s, timeout=180, settle=3.0)
    assert w.running, "the worker did not survive the broker restart"
    assert w.stop() == 0
    problems = ledger_report(s, lab.tmp).problems(fleet.manifest)
    assert problems == [], "\n".join(problems)


@pytest.mark.timeout(180)
def test_duplicates_and_out_of_order_delivery_change_nothing(lab: FaultLab) -> None:
    fleet = simulate(FleetConfig(runs=200, seed=82, duplicates=0.2, reorder_window=6))
    seqs: dict[bytes, list[int]] = {}
    for r in fleet.records:
        if r.event is not None:
            seqs.setdefault(r.key, []).append(int(r.event["seq"]))
    assert fleet.manifest["counts"]["duplicates"] > 100
    assert sum(s != sorted(s) for s in seqs.values()) > 20, "too few runs arrive out of order"
    s = lab.settings("w")
    lab.publish(fleet, s)
    w = lab.worker(s, "w")
    lab.drain(w, s, settle=1.5)
    # A producer retrying after a lost acknowledgement re-sends records whose runs have
    # closed since: the same event ids again, which change nothing.
    lab.publish(fleet, s, fleet.records[-300:])
    lab.drain(w, s)
    assert w.stop() == 0
    problems = ledger_report(s, lab.tmp).problems(fleet.manifest)
    assert problems == [], "\n".join(problems)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_second_worker_joining_then_leaving_keeps_the_ledger_exact(lab: FaultLab) -> None:
    fleet = simulate(FleetConfig(runs=240, seed=83, **CHAOS))
    a, b = lab.settings("a"), lab.settings("b")
    third = len(fleet.records) // 3
    lab.publish(fleet, a, fleet.records[:third])
    wa = lab.worker(a, "a")
    lab.drain(wa, a, settle=1.0)

    wb = lab.worker(b, "b")
    _wait_for_members(a, 2)  # first rebalance: b took partitions from a
    lab.publish(fleet, a, fleet.records[third : 2 * third])
    lab.drain(wb, a, settle=1.0)
    assert wb.stop() == 0
    _wait_for_members(a, 1)  # second rebalance: a took them back
    lab.publish(fleet, a, fleet.records[2 * third :])
    lab.drain(wa, a, settle=3.0)
    assert wa.stop() == 0

    assert ledger_report(b, lab.tmp).events > 0, "the second worker never applied an event"
    # Two embedded engines cannot share files: fold b's rows into a's, as one server would.
    merge_ledger(src_dsn=b.clickhouse_dsn, dst_dsn=a.clickhouse_dsn, tmp=lab.tmp)
    problems = ledger_report(a, lab.tmp).problems(fleet.manifest)
    assert problems == [], "\n".join(problems)


@pytest.mark.timeout(180)
def test_records_the_consumer_dropped_are_got_back_and_stored_once(lab: FaultLab) -> None:
    """Records handed out by the consumer and dropped before they were stepped (the
    ``drop_fetch`` fault) are not fetched again: the worker must get them back by itself.

    Which way depends on timing, and each is right: a later record of the partition shows
    the gap (``the consumer skipped``), or none follows and the consumer's position stays
    past the worker's (``were not delivered in``; ``tests/unit/test_worker_watch.py``
    pins that path), or a rebalance right after the drop seeks the partition back to the
    worker's position and the records come again. The ledger must hold every event once.
    """
    fleet = simulate(FleetConfig(runs=60, seed=84))
    s = lab.settings("w", undelivered_read_back_seconds=2.0).model_copy(
        update={"batch_max_events": 10_000}
    )
    lab.publish(fleet, s)  # all of it before the worker starts
    w = lab.worker(s, "w", faults="drop_fetch:1")
    lab.drain(w, s, timeout=90, settle=3.0)  # and the stale run is declared incomplete
    [dropped] = fault_lines(w)
    assert dropped.startswith("drop_fetch: chunk 1 "), dropped
    assert w.stop() == 0
    report = ledger_report(s, lab.tmp)
    want = fleet.manifest["counts"]["applied_events"]
    assert (report.events, len(report.event_ids)) == (want, want)  # every event once
    # and the whole manifest: runs whose staleness the late partition decides included
    problems = report.problems(fleet.manifest)
    assert problems == [], "\n".join(problems)


@pytest.mark.timeout(180)
def test_bad_records_reach_the_dlq_with_their_reason_and_the_partition_keeps_flowing(
    lab: FaultLab,
) -> None:
    fleet = simulate(FleetConfig(runs=40, seed=1, malformed=0.6, oversized=0.15))
    bad = {r.value: r for r in fleet.records if r.kind != "valid"}
    # Every kind of bad record is in this fleet: malformed JSON, wrong types, a priced
    # estimate, an oversized record.
    assert {r.note.removesuffix(" (extra)") for r in bad.values()} == {
        "truncated_json",
        "invalid_utf8",
        "not_an_object",
        "wrong_type",
        "priced_estimate",
        "oversized",
    }
    s = lab.settings("w")
    lab.publish(fleet, s)
    w = lab.worker(s, "w")
    lab.drain(w, s)
    assert w.stop() == 0
    report = ledger_report(s, lab.tmp)
    problems = report.problems(fleet.manifest)
    assert problems == [], "\n".join(problems)

    sent = {(m.partition, m.offset): m for m in read_topic(s, s.topics.input)}
    dlq = read_topic(s, s.topics.dlq)
    assert len(dlq) == sum(r.value in bad for r in fleet.records)
    for m in dlq:
        h = {k: v.decode() for k, v in m.headers}
        where = (int(h["source-partition"]), int(h["source-offset"]))
        original = bad[sent[where].value]
        assert (h["source-topic"], m.key, m.value) == (s.topics.input, original.key, original.value)
        assert h["reason-code"] == original.kind and h["reason"], h
        if original.note.startswith("priced_estimate"):
            assert "estimat" in h["reason"], h["reason"]
        sha = hashlib.sha256(original.value).hexdigest()
        assert report.dead_letters[where] == (original.kind, h["reason"], sha)
        # The partition kept flowing: the next valid record on it was applied (this
        # fleet has no duplicates nor post-terminal events: every valid record applies).
        follower = next(
            r
            for (p, o), r in sorted(sent.items())
            if p == where[0] and o > where[1] and r.value not in bad
        )
        assert orjson.loads(follower.value)["eventId"] in report.event_ids
    assert len(report.dead_letters) == len(dlq)


def _wait_for_members(settings: Settings, count: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    state = ("?", 0)
    while time.monotonic() < deadline:
        try:
            state = group_members(settings)
        except Exception:  # the coordinator may be moving
            state = ("?", 0)
        if state == ("Stable", count):
            return
        time.sleep(0.5)
    raise AssertionError(
        f"group {settings.consumer_group} did not settle on {count} "
        f"member(s) in {timeout:.0f}s; last seen {state}"
    )
