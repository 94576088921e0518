"""The run-semantics core against CONTRACT.md's rules, one rule per test, no services."""

from __future__ import annotations

import dataclasses
import gc
import tracemalloc
from datetime import timedelta

import orjson
import pytest

from prism.pipeline.core import CoreConfig, InRecord, Intake, Processor, RunState
from prism.pipeline.core._run import Tombstone, from_us
from tests.fixtures.final_ledger import FinalLedger
from tests.fixtures.runs import NOW, T0, RunBuilder, deliveries

CFG = CoreConfig(grace_period_s=30, stale_after_s=3600, tombstone_retention_s=86400)


def last_run_row(out, run_id="r1"):
    rows = [r for r in out.ledger.runs if r.run_id == run_id]
    assert rows, f"no run row for {run_id}"
    return max(rows, key=lambda r: r.version)


def test_simple_run_closes_once_with_its_record():
    b = (
        RunBuilder()
        .started()
        .turn(1, usage={"inputTokens": 100, "outputTokens": 5})
        .finished(finishReason="stop")
    )
    proc = Processor(CFG, partition=0)
    out = proc.process(deliveries(b.events), NOW)
    row = last_run_row(out)
    assert (row.status, row.terminal_type, row.model_turns, row.closed) == (
        "succeeded",
        "agent_finished",
        1,
        True,
    )
    assert row.missing_count == 0 and row.finish_reason == "stop"
    assert len(out.closed) == 1 and orjson.loads(out.closed[0].value)["runId"] == "r1"
    assert len(out.ledger.events) == 3
    # A second delivery of the same batch (a crash before the commit) changes nothing.
    again = proc.process(deliveries(b.events), NOW)
    assert again.stats["duplicate"] == 3 and not again.ledger.events and not again.closed


def test_restart_from_state_recognises_an_already_applied_batch():
    b = RunBuilder().started().turn(1).turn(2)
    first = Processor(CFG, partition=0)
    out = first.process(deliveries(b.events), NOW)
    restored = Processor(CFG, partition=0)
    restored.load((k, v) for k, v in out.state_writes.items() if v is not None)
    again = restored.process(deliveries(b.events), NOW)
    assert again.stats["duplicate"] == 3 and again.stats["applied"] == 0
    assert not again.ledger.events and not again.ledger.turns


def test_same_seq_with_a_new_event_id_changes_nothing_and_is_quarantined():
    b = RunBuilder().started().turn(1)
    dup = dict(b.events[1], eventId="zz-other-id")  # sorts after the original: it loses
    out = Processor(CFG).process(deliveries([*b.events, dup]), NOW)
    assert out.stats["applied"] == 2 and out.stats["quarantine.duplicate_seq"] == 1
    assert [(q.event_id, q.reason) for q in out.ledger.quarantine] == [
        ("zz-other-id", "duplicate_seq")
    ]
    assert last_run_row(out).model_turns == 1


def test_limit_death_out_of_order_carries_breach_and_attribution():
    b = RunBuilder().started().turn(1).limit_death("maxInputTokens")
    ev = b.events
    shuffled = [ev[0], ev[4], ev[1], ev[3], ev[2]]  # error before the limit records
    proc = Processor(CFG, partition=0)
    out = proc.process(deliveries(shuffled[:3]), NOW)
    assert not out.closed  # terminal seen, but seq 2 and 3 are missing: wait for them
    out = proc.process(deliveries(shuffled[3:], start_offset=3), NOW)
    row = last_run_row(out)
    assert row.status == "failed" and row.closed and row.missing_count == 0
    assert (row.exhaustion_limit, row.exhaustion_maximum, row.exhaustion_observed) == (
        "maxInputTokens",
        8.0,
        9.0,
    )
    assert row.exhaustion_axis == "maxInputTokens"
    assert orjson.loads(row.exhaustion_closest) == [
        {"axis": "maxInputTokens", "used": 9, "maximum": 8}
    ]
    assert [d.axis for d in out.limit_deaths] == ["maxInputTokens"]
    timeline = orjson.loads(out.closed[0].value)
    assert timeline["exhaustion"]["axis"] == "maxInputTokens" and timeline["status"] == "failed"


def test_limit_record_without_terminal_is_not_a_closed_run():
    b = RunBuilder().started().turn(1)
    b.add("run_limit_exceeded", {"limit": "maxTurns", "maximum": 1, "observed": 2})
    out = Processor(CFG).process(deliveries(b.events), NOW)
    assert not out.closed and last_run_row(out).status == "running"


def test_duplicate_terminal_changes_nothing():
    b = RunBuilder().started().finished()
    proc = Processor(CFG)
    proc.process(deliveries(b.events), NOW)
    out = proc.process(deliveries([b.events[1]]), NOW)
    assert out.stats["duplicate"] == 1 and not out.closed and not out.ledger.quarantine


def test_conflicting_terminal_is_quarantined():
    b = RunBuilder().started().finished()
    b.add("error", {"error": {"code": "x", "message": "m"}})
    out = Processor(CFG).process(deliveries(b.events), NOW)
    assert [q.reason for q in out.ledger.quarantine] == ["conflicting_terminal"]
    assert last_run_row(out).status == "succeeded" and len(out.closed) == 1
    assert dict(out.quarantined[0].headers)["reason"] == b"conflicting_terminal"


def test_post_terminal_event_is_quarantined_and_changes_nothing():
    b = RunBuilder().started().finished()
    b.turn(5, usage={"inputTokens": 10})
    out = Processor(CFG).process(deliveries(b.events), NOW)
    assert [q.reason for q in out.ledger.quarantine] == ["post_terminal"]
    row = last_run_row(out)
    assert row.model_turns == 0 and not out.ledger.turns
    assert all(e.seq < 2 for e in out.ledger.events if not e.retracted)
    # its rows are written retracted, over any a step never committed stored as counted
    assert [(e.seq, e.retracted) for e in out.ledger.events if e.seq >= 2] == [(2, True)]


def test_gap_closes_after_grace_with_missing_seqs_then_late_fill_updates_record():
    b = RunBuilder().started().turn(1).turn(2).finished()
    events = [b.events[0], b.events[1], b.events[3]]  # seq 2 missing
    proc = Processor(CFG, partition=0)
    out = proc.process(deliveries(events), NOW)
    assert not out.closed
    later = RunBuilder("other", start=T0 + timedelta(seconds=60)).started()
    out = proc.process(deliveries(later.events), NOW)  # watermark passes terminal + grace
    row = last_run_row(out)
    assert row.closed and row.missing_ranges == [(2, 2)] and row.status == "succeeded"
    assert len(out.closed) == 1
    fill = proc.process(deliveries([b.events[2]]), NOW)  # the gap fills late: applied
    row = last_run_row(fill)
    assert row.missing_count == 0 and row.model_turns == 2 and not fill.closed


def test_processing_time_grace_closes_a_quiet_partition():
    b = RunBuilder().started().turn(1).turn(2).finished()
    proc = Processor(CFG)
    proc.process(deliveries([b.events[0], b.events[3]]), now=NOW)
    assert not proc.tick(now=NOW + 10).closed
    out = proc.tick(now=NOW + 31)
    row = last_run_row(out)
    assert len(out.closed) == 1 and (row.missing_ranges, row.missing_count) == ([(1, 2)], 2)


def test_stale_run_is_marked_incomplete_on_event_time_and_alerted():
    stale = RunBuilder("stale").started().turn(1)
    fresh = RunBuilder("fresh", start=T0 + timedelta(hours=2)).started()
    proc = Processor(CFG)
    out = proc.process(deliveries(stale.events + fresh.events), NOW)
    assert last_run_row(out, "stale").status == "incomplete"
    assert last_run_row(out, "fresh").status == "running"
    assert [(a.rule, a.state, a.key) for a in out.ledger.alerts] == [
        ("stale_run", "firing", "stale")
    ]
    (fired,) = out.ledger.alerts
    # it fires at the event time the run went stale, not at the watermark that saw it
    # (two hours on): where batches cut must not move it (rule 10)
    assert fired.ts == fired.window_end == fired.window_start + timedelta(seconds=3600)
    assert fired.value == fired.threshold == CFG.stale_after_s == 3600
    assert from_us(proc.clock.watermark_us) > fired.ts + timedelta(minutes=30)
    assert not out.closed  # no made-up terminal
    # its terminal arrives after all: the run closes and the alert resolves
    late = RunBuilder("stale").started().turn(1).finished()
    out = proc.process(deliveries(late.events[2:]), NOW)
    assert last_run_row(out, "stale").status == "succeeded"
    assert [(a.rule, a.state) for a in out.ledger.alerts] == [("stale_run", "resolved")]


def test_absent_cache_stays_null_and_zero_stays_zero():
    b = RunBuilder().started()
    b.turn(1, usage={"inputTokens": 100}, cache={"cacheReadTokens": 0})
    b.turn(2, usage={"inputTokens": 100})
    b.finished()
    out = Processor(CFG).process(deliveries(b.events), NOW)
    turns = {t.turn: t for t in out.ledger.turns}
    assert turns[1].cache_read_tokens == 0 and turns[1].cache_hit_rate == 0.0
    assert turns[2].cache_read_tokens is None and turns[2].cache_hit_rate is None
    assert last_run_row(out).cache_hit_rate == 0.0


def test_run_cache_hit_rate_is_input_token_weighted_and_absent_without_reports():
    b = RunBuilder().started()
    b.turn(1, usage={"inputTokens": 100}, cache={"cacheReadTokens": 90})
    b.turn(2, usage={"inputTokens": 900}, cache={"cacheReadTokens": 0})
    b.turn(3, usage={"inputTokens": 5000})  # reports no cache: not in the weighting
    b.finished()
    out = Processor(CFG).process(deliveries(b.events), NOW)
    assert last_run_row(out).cache_hit_rate == pytest.approx(90 / 1000)
    none = RunBuilder("r2").started().turn(1, usage={"inputTokens": 10}).finished()
    out = Processor(CFG).process(deliveries(none.events), NOW)
    assert last_run_row(out, "r2").cache_hit_rate is None


def test_reported_usage_wins_over_an_estimate_for_the_same_turn():
    b = RunBuilder().started()
    b.turn(1, usage={"inputTokens": 90, "outputTokens": 9, "estimated": True, "confidence": "low"})
    b.usage(turn=1, attempt=1, inputTokens=120, outputTokens=12, cost="0.01", currency="USD")
    b.finished()
    out = Processor(CFG).process(deliveries(b.events), NOW)
    t = [t for t in out.ledger.turns if t.turn == 1][-1]
    assert (t.input_tokens, t.usage_source, t.usage_confidence) == (120, "reported", None)
    # ...and an estimate arriving after the report does not replace it
    b2 = RunBuilder("r2").started()
    b2.usage(turn=1, attempt=1, inputTokens=120, outputTokens=12)
    b2.turn(1, usage={"inputTokens": 90, "estimated": True, "confidence": "medium"}).finished()
    out = Processor(CFG).process(deliveries(b2.events), NOW)
    t = [t for t in out.ledger.turns if t.turn == 1][-1]
    assert (t.input_tokens, t.usage_source) == (120, "reported")


def test_run_total_mismatch_is_flagged_and_usage_rows_keep_scope():
    ok = RunBuilder("ok").started().turn(1).turn(2)
    ok.usage(turn=1, attempt=1, inputTokens=10, outputTokens=1)
    ok.usage(turn=2, attempt=1, inputTokens=20, outputTokens=2)
    ok.usage("run_total", inputTokens=30, outputTokens=3).finished()
    bad = RunBuilder("bad").started().turn(1)
    bad.usage(turn=1, attempt=1, inputTokens=10).usage("run_total", inputTokens=11).finished()
    out = Processor(CFG).process(deliveries(ok.events + bad.events), NOW)
    assert last_run_row(out, "ok").usage_mismatch is False
    assert last_run_row(out, "bad").usage_mismatch is True
    assert sorted(u.scope for u in out.ledger.usage if u.run_id == "ok") == [
        "provider_turn",
        "provider_turn",
        "run_total",
    ]


def test_deterministic_turns_never_count_as_model_turns():
    b = RunBuilder().started().turn(1)
    b.add("deterministic_turn_finished", {"turn": 2, "middleware": "cache.replay"}).finished()
    out = Processor(CFG).process(deliveries(b.events), NOW)
    row = last_run_row(out)
    assert (row.model_turns, row.deterministic_turns) == (1, 1)
    det = [t for t in out.ledger.turns if t.kind == "deterministic"]
    assert det[0].middleware == "cache.replay" and det[0].input_tokens is None


@pytest.mark.parametrize(
    ("terminal", "expected"),
    [
        ({"type": "agent_finished", "data": {"stopReason": "turn_limit"}}, "succeeded"),
        ({"type": "agent_denied", "data": {"reason": "policy"}}, "denied"),
        ({"type": "error", "data": {"error": {"code": "c", "message": "m"}}}, "failed"),
        (
            {
                "type": "error",
                "data": {
                    "error": {"code": "c", "message": "m"},
                    "aborted": True,
                    "abortReason": "user",
                },
            },
            "aborted",
        ),
    ],
)
def test_terminal_type_decides_status(terminal, expected):
    b = RunBuilder().started().add(terminal["type"], terminal["data"])
    out = Processor(CFG).process(deliveries(b.events), NOW)
    assert last_run_row(out).status == expected


def test_suspended_run_and_resume():
    b = RunBuilder().started().add("run_suspended", {"reason": "approval"})
    proc = Processor(CFG)
    assert last_run_row(proc.process(deliveries(b.events), NOW)).status == "suspended"
    b.add("run_resumed", {})
    assert (
        last_run_row(proc.process(deliveries(b.events[2:], start_offset=2), NOW)).status
        == "running"
    )


def test_unknown_type_is_kept_in_the_raw_log_but_changes_no_state():
    b = RunBuilder().started().add("memory_compacted", {"bytes": 12}).finished()
    out = Processor(CFG).process(deliveries(b.events), NOW)
    assert [e.type for e in out.ledger.events] == [
        "agent_started",
        "memory_compacted",
        "agent_finished",
    ]
    assert last_run_row(out).status == "succeeded"


def test_children_link_and_narrowing_appear_on_the_timeline():
    parent = RunBuilder("p").started()
    parent.add("child_milestone", {"delegationId": "d1", "childId": "c1", "childRunId": "child"})
    parent.add(
        "child_failed",
        {
            "delegationId": "d1",
            "childId": "c1",
            "childRunId": "child",
            "error": {"code": "x", "message": "m"},
            "breach": {"limit": "maxTurns", "maximum": 2, "observed": 3},
        },
    )
    parent.add("tool_narrowing_clamped", {"turn": 1, "dropped": ["web.search"]}).finished()
    child = RunBuilder("child", parent={"runId": "p", "delegationId": "d1", "childId": "c1"})
    child.started().finished()
    out = Processor(CFG).process(deliveries(parent.events + child.events), NOW)
    tl = {orjson.loads(r.value)["runId"]: orjson.loads(r.value) for r in out.closed}
    assert tl["p"]["children"][0]["failed"]["breach"]["limit"] == "maxTurns"
    assert tl["p"]["toolNarrowing"] == [{"turn": 1, "dropped": ["web.search"]}]
    assert last_run_row(out, "child").parent_run_id == "p"


def test_closed_runs_shrink_to_tombstones_and_expire_after_retention():
    cfg = CoreConfig(grace_period_s=30, stale_after_s=3600, tombstone_retention_s=600)
    b = RunBuilder().started().turn(1).finished()
    proc = Processor(cfg)
    proc.process(deliveries(b.events), NOW)
    assert proc.thawed()["r1"].tombstone is None  # facts stay through the grace period
    tick = RunBuilder("tick", start=T0 + timedelta(seconds=40)).started()
    proc.process(deliveries(tick.events), NOW)  # event time passes close + grace
    assert proc.thawed()["r1"].tombstone and proc.thawed()["r1"].facts == {}
    # still catches a duplicate and a post-terminal event
    b.turn(2)
    out = proc.process(deliveries([b.events[1], b.events[3]]), NOW)
    assert out.stats["duplicate"] == 1 and [q.reason for q in out.ledger.quarantine] == [
        "post_terminal"
    ]
    later = RunBuilder("later", start=T0 + timedelta(minutes=20)).started()
    out = proc.process(deliveries(later.events), NOW)
    assert "r1" not in proc.thawed() and out.state_writes[proc.run_key("r1")] is None


def test_a_run_at_rest_is_held_packed_and_decodes_to_what_was_written():
    """A closed run rests compressed (``_pack``): in a fraction of its state record, which
    the step still writes whole, and decoded again to the same state when asked for; a
    run restored from its record rests in that record as it came."""
    b = RunBuilder().started()
    for turn in range(1, 9):
        b.turn(turn)
    b.finished()
    proc = Processor(CFG)
    out = proc.process(deliveries(b.events), NOW)
    written = out.state_writes[proc.run_key("r1")]
    assert written is not None and written.startswith(b"{")
    held = proc._cold["r1"]
    assert held[:1] == b"\x00" and len(held) < len(written) / 2
    assert proc.thawed()["r1"].to_bytes() == written
    again = Processor(CFG)
    again.load((k, v) for k, v in out.state_writes.items() if v is not None)
    assert again._cold["r1"] == written
    assert again.thawed()["r1"].to_bytes() == written


def test_the_record_a_resting_run_will_shrink_to_is_held_at_its_size():
    """A closed run at rest keeps the record its shrink will write, unpacked (a tombstone's
    hashes do not compress). orjson's result keeps its buffer (8 KiB for ~1 KiB), so the
    record is held as a copy of its size: freeing the held records gives back about their
    length, not their buffers."""
    proc = Processor(CFG)
    tracemalloc.start()  # before the records are made: it counts only what it saw made
    try:
        for i in range(100):
            b = RunBuilder(f"r{i}").started().turn(1).turn(2).finished()
            proc.process(deliveries(b.events), NOW)
        held = {k: v[1] for k, v in proc._rest_meta.items() if v[1] is not None}
        assert len(held) == 100 and all(r.startswith(b"{") for r in held.values())
        size, keys = sum(map(len, held.values())), list(held)
        del held
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        for key in keys:  # the held record's one reference
            proc._rest_meta[key] = (proc._rest_meta[key][0], None)
        gc.collect()
        freed = before - tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert size / 2 < freed < size + 100 * 64  # each record and its object header, no more


def test_a_closed_run_shrinks_at_rest_undecoded_and_a_rollback_puts_it_back_whole():
    """A closed run at rest whose owner is known shrinks to the record made when it was
    put to rest (``_replace_resting``): the same record a decoded run's shrink writes,
    without reading what the run rests in. A rollback of that step puts the run back at
    rest as it was, and the step taken again shrinks it alike."""
    cfg = CoreConfig(grace_period_s=30, stale_after_s=3600, tombstone_retention_s=600)
    b = RunBuilder().started().turn(1).turn(2).finished()
    tick = RunBuilder("tick", start=T0 + timedelta(seconds=40)).started()  # past the grace
    decoded = Processor(cfg)
    decoded.process(deliveries(b.events), NOW)
    decoded.thawed()  # every run decoded: its shrink takes the decoded path
    expected = decoded.process(deliveries(tick.events), NOW).state_writes[decoded.run_key("r1")]
    assert expected is not None and orjson.loads(expected)["tb"] is not None

    proc = Processor(cfg)
    proc.process(deliveries(b.events), NOW)
    held = proc._cold["r1"]
    assert held[:1] == b"\x00" and "r1" not in proc.items  # closed, at rest, packed
    proc._cold["r1"] = unreadable = b"\x00no record"  # a shrink that decoded would fail
    proc.begin()
    out = proc.process(deliveries(tick.events), NOW)
    assert out.state_writes[proc.run_key("r1")] == expected and "r1" not in proc.items
    proc.rollback()
    assert proc._cold["r1"] == unreadable and "r1" not in proc.items  # at rest, as it was
    proc._cold["r1"] = held
    proc.begin()
    out = proc.process(deliveries(tick.events), NOW)
    proc.commit()
    assert out.state_writes[proc.run_key("r1")] == expected
    assert proc._cold["r1"] == expected  # the tombstone rests as written: it barely packs
    assert proc.thawed()["r1"].to_bytes() == expected  # and decodes to itself


def test_a_run_closed_with_a_gap_rests_and_still_waits_for_it():
    """A run the watermark closes with a seq missing rests in its bytes without a verdict
    for its shrink: when the shrink is due, its facts are judged again and it keeps them."""
    cfg = CoreConfig(grace_period_s=30, stale_after_s=3600, tombstone_retention_s=600)
    b = RunBuilder().started().turn(1).turn(2).finished()
    proc = Processor(cfg)
    proc.process(deliveries(b.events[:1] + b.events[2:]), NOW)  # seq 1 missing
    tick = RunBuilder("tick", start=T0 + timedelta(seconds=40)).started()
    out = proc.process(deliveries(tick.events), NOW)  # terminal + grace passed: closed
    assert [(r.closed, r.missing_count) for r in out.ledger.runs if r.run_id == "r1"] == [(True, 1)]
    assert "r1" in proc._cold and "r1" not in proc._rest_meta
    later = RunBuilder("later", start=T0 + timedelta(seconds=120)).started()
    proc.process(deliveries(later.events), NOW)  # its close + grace passed: due to shrink
    run = proc.thawed()["r1"]
    assert run.closed and run.tombstone is None and len(run.facts) == 3
    out = proc.process(deliveries(b.events[1:2]), NOW)  # the gap fills late, on its facts
    assert [r.missing_count for r in out.ledger.runs if r.run_id == "r1"] == [0]


@pytest.mark.pure_core
def test_a_run_is_classified_again_only_when_its_facts_change(monkeypatch):
    from prism.pipeline.core import _processor

    judged: list[int] = []  # the number of facts each classification judged
    real = _processor.classify

    def counting(facts):
        judged.append(len(facts))
        return real(facts)

    monkeypatch.setattr(_processor, "classify", counting)
    proc = Processor(CFG)
    b = RunBuilder().started().turn(1).turn(2).finished()
    events = b.events
    proc.process(deliveries(events[:1] + events[2:]), NOW)  # seq 1 missing: no close yet
    assert judged == [3]
    backup = proc.runs["r1"].copy()
    assert backup.classified is None  # a copy starts without the cache
    proc.process(deliveries(events[1:2]), NOW)  # the gap fills: judged anew, then closed
    assert judged == [3, 4]  # the close reused the settle's verdict
    assert "r1" not in proc.runs and "r1" in proc._cold  # closed: it rests in its bytes
    tick = RunBuilder("tick", start=T0 + timedelta(seconds=40)).started()
    proc.process(deliveries(tick.events), NOW)  # past close + grace: decoded and shrunk
    assert judged == [3, 4, 1]  # the third: the new run "tick"; r1's rested verdict served
    shrunk = proc.thawed()["r1"]
    assert shrunk.tombstone is not None and shrunk.classified is None


def test_state_round_trips_through_bytes():
    b = RunBuilder().started().turn(1, usage={"inputTokens": 5})
    proc = Processor(CFG)
    proc.process(deliveries(b.events), NOW)
    st = proc.runs["r1"]
    assert RunState.from_bytes(st.to_bytes()) == st


def test_mismatch_compares_run_total_with_usage_rows_not_inline_turn_usage():
    # the provider_turn usage row of turn 2 was lost: the turn's own usage must not hide it
    b = RunBuilder().started()
    b.turn(1, usage={"inputTokens": 10}).usage(turn=1, attempt=1, inputTokens=10)
    b.turn(2, usage={"inputTokens": 20})
    b.usage("run_total", inputTokens=30).finished()
    out = Processor(CFG).process(deliveries(b.events), NOW)
    assert last_run_row(out).usage_mismatch is True
    turn2 = [t for t in out.ledger.turns if t.turn == 2][-1]
    assert turn2.input_tokens == 20 and turn2.usage_source == "reported"


def test_estimate_rows_are_marked_superseded_when_a_report_exists_in_either_order():
    b = RunBuilder().started().turn(1)
    b.usage(turn=1, attempt=1, inputTokens=90, estimated=True, confidence="low")
    b.usage(turn=1, attempt=1, inputTokens=120, cost="0.01", currency="USD")
    b.usage(turn=1, attempt=2, inputTokens=50, estimated=True, confidence="medium").finished()
    out = Processor(CFG).process(deliveries(b.events), NOW)
    current = {}
    for row in out.ledger.usage:  # what ReplacingMergeTree keeps: the highest version per event
        if row.event_id not in current or row.version > current[row.event_id].version:
            current[row.event_id] = row
    by_seq = {r.seq: (r.estimated, r.superseded) for r in current.values()}
    assert by_seq == {2: (True, True), 3: (False, False), 4: (True, False)}
    # the same turn with the report first: the late estimate is written superseded at once
    b2 = RunBuilder("r2").started().turn(1)
    b2.usage(turn=1, attempt=1, inputTokens=120)
    b2.usage(turn=1, attempt=1, inputTokens=90, estimated=True, confidence="low").finished()
    out = Processor(CFG).process(deliveries(b2.events), NOW)
    assert [(u.seq, u.superseded) for u in out.ledger.usage] == [(2, False), (3, True)]


def test_intake_tick_skips_lanes_a_step_ticked_within_quiet_for():
    def records(builder, partition):  # a gap at seq 1-2: the run waits for its grace period
        events = [builder.events[0], builder.events[3]]
        return [InRecord(orjson.dumps(e), "t.events", partition, i) for i, e in enumerate(events)]

    intake = Intake(CFG)
    busy = RunBuilder("busy").started().turn(1).turn(2).finished()
    quiet = RunBuilder("quiet").started().turn(1).turn(2).finished()
    intake.step(0, records(quiet, 0), NOW)
    intake.commit(0)
    intake.step(1, records(busy, 1), NOW + 25)
    intake.commit(1)
    # 31 s after partition 0's step its grace period is over; partition 1 was stepped 6 s
    # ago (its step ticked it) and is left alone
    outs = intake.tick(NOW + 31, quiet_for=10)
    intake.commit(outs)
    assert list(outs) == [0]
    assert [orjson.loads(r.value)["runId"] for r in outs[0].closed] == ["quiet"]
    assert intake.tick(NOW + 32, quiet_for=10) == {}  # partition 0 was just ticked
    everything = intake.tick(NOW + 32)  # quiet_for=0: every lane, as before
    assert sorted(everything) == [0, 1]
    intake.commit(everything)
    # a lane with input waiting is not quiet, however long ago it was stepped
    assert intake.quiet(NOW + 60, quiet_for=10, busy={1}) == [0]
    assert list(intake.tick(NOW + 60, quiet_for=10, busy={0})) == [1]


def test_a_run_without_a_tenant_keeps_its_facts_so_a_later_event_can_name_the_owner():
    """Rule 11 by the set (rule 10): a run whose events all omit the tenant up to its
    terminal, then a second terminal that names one. Read before the run shrank, that event
    makes its tenant the owner and is ``conflicting_terminal``; a tombstone without an owner
    took it for ``tenant_mismatch`` and left the run on no tenant, so the ledger depended on
    when the event came (found by the repartition property, where copies arrive late)."""
    run = RunBuilder("r1").started().turn(1).finished().finished(finishReason="again")
    for ev in run.events[:3]:
        del ev["tenantId"]
    later = RunBuilder("r2", start=T0 + timedelta(hours=1)).started()  # moves event time on
    orders = {
        "before": [*run.events, *later.events],
        "after": [*run.events[:3], *later.events, run.events[3]],
    }
    seen = {}
    for name, events in orders.items():
        intake, ledger = Intake(CoreConfig(processing_grace=False)), FinalLedger()
        for i, ev in enumerate(events):  # one line at a time: shrinks happen in between
            ledger.add(intake.step(-1, [InRecord(orjson.dumps(ev), "f", -1, i)], NOW))
            intake.commit(-1)
        ledger.add(intake.finalize(NOW))
        seen[name] = (
            ledger.reasons(),
            ledger.status("r1"),
            ledger.tables["runs"][("r1",)].tenant_id,
        )
    assert seen["after"] == seen["before"] == ({"r1-e3": "conflicting_terminal"}, "succeeded",
                                                "acme")  # fmt: skip


def test_a_quarantined_event_stamped_beyond_the_clock_does_not_flag_its_run():
    """Rule 14 flags a run for an applied event stamped beyond the clock; a post-terminal
    one changes nothing (rule 2), as the simulator's truth says. The run's row said
    ``clock_skew`` when the event came while the run was whole, and not when it came after
    the run shrank to a tombstone (found by the repartition property)."""
    run = RunBuilder("r1").started().turn(1).finished()
    run.add("agent_finished", {"finishReason": "again"}, ts=T0.replace(year=2199))
    skewed_run = RunBuilder("r3").started().finished()
    skewed_run.events[1]["ts"] = T0.replace(year=2199).isoformat()  # its terminal: applied
    later = RunBuilder("r2", start=T0 + timedelta(hours=1)).started()  # moves event time on
    orders = {
        "before": [*run.events, *skewed_run.events, *later.events],
        "after": [*run.events[:3], *later.events, run.events[3], *skewed_run.events],
    }
    seen = {}
    for name, events in orders.items():
        intake, ledger = Intake(CoreConfig(processing_grace=False)), FinalLedger()
        for i, ev in enumerate(events):
            ledger.add(intake.step(-1, [InRecord(orjson.dumps(ev), "f", -1, i)], NOW))
            intake.commit(-1)
        ledger.add(intake.finalize(NOW))
        seen[name] = {r.run_id: r.clock_skew for r in ledger.rows("runs")}
    assert seen["before"] == seen["after"] == {"r1": False, "r2": False, "r3": True}


def test_a_run_closed_by_a_skewed_terminal_before_any_mark_is_not_forgotten_at_once():
    """A skewed terminal's time is no event time (rule 14). Its run closed at the
    watermark alone, which is 0 while another lane has records waiting and no mark yet;
    the next tick then forgot the run (retention past 0), and a conflicting terminal that
    came later began a new run and was applied, where with the other lane's mark first it
    is quarantined (found by the repartition property's deep profile). The run now closes
    at the clock plus the skew, the furthest rule 14 lets the terminal reach."""
    run = RunBuilder("r1").started().turn(1)
    run.finished(finishReason="stop")
    run.events[-1]["ts"] = T0.replace(year=2199).isoformat()  # the terminal: skewed
    run.finished(finishReason="again")  # a conflicting terminal, at T0 + 3 s (seq 3)
    other = RunBuilder("r2", start=T0 + timedelta(hours=1)).started()  # moves event time on

    def ledger_of(steps: list[tuple[int, list[dict[str, object]]]]) -> FinalLedger:
        intake, ledger = Intake(CoreConfig(processing_grace=False)), FinalLedger()
        intake.behind(1, True)  # lane 1 has records waiting and no mark: watermark 0
        offsets = {0: 0, 1: 0}
        for lane, events in steps:
            records = []
            for ev in events:
                records.append(InRecord(orjson.dumps(ev), "f", lane, offsets[lane]))
                offsets[lane] += 1
            ledger.add(intake.step(lane, records, NOW))
            intake.commit(lane)
            if lane == 1:
                intake.behind(1, False)
            for ticked, out in intake.tick(NOW).items():  # every lane judges the watermark
                ledger.add(out)
                intake.commit(ticked)
        ledger.add(intake.finalize(NOW))
        return ledger

    marked_first = ledger_of([(1, other.events), (0, run.events)])
    closed_at_0 = ledger_of([(0, run.events[:3]), (1, other.events), (0, run.events[3:])])
    assert marked_first.reasons() == {"r1-e3": "conflicting_terminal"}
    assert closed_at_0.snapshot() == marked_first.snapshot()


def test_a_shrunk_state_keeps_every_field_but_the_facts() -> None:
    """``RunState.shrunk`` builds the new state field by field: it equals what
    ``dataclasses.replace`` makes, so a field added later cannot be left behind."""
    state = RunState(
        run_id="r1",
        facts={"e1": {"s": 0}, "e2": {"s": 1}},
        emitted={"e1": ["ok"]},
        turns={"model|1|0": ["e1"]},
        terminal={"seq": 1, "id": "e2", "type": "agent_finished", "ts": 5, "arrived": 2},
        incomplete=True,
        closed=True,
        closed_wm_us=7,
        clock_skew=True,
        arrivals=2,
        last_us=9,
        alerts={"stale": "firing"},
        tombstone=Tombstone(0, {1}, {}),  # replaced by the shrink's
    )
    for f in dataclasses.fields(RunState):  # every field set: a new one must be set here too
        if f.init and f.default is not dataclasses.MISSING:
            assert getattr(state, f.name) != f.default, f"set {f.name} above"
        if f.init and f.default_factory is not dataclasses.MISSING:
            assert getattr(state, f.name) != f.default_factory(), f"set {f.name} above"
    meta = {"tenant_id": "t1"}
    shrunk = state.shrunk(meta)
    expected = dataclasses.replace(
        state, facts={}, emitted={}, turns={}, tombstone=state._tombstone(meta)
    )
    for f in dataclasses.fields(RunState):
        assert getattr(shrunk, f.name) == getattr(expected, f.name), f.name
    assert shrunk.alerts is not state.alerts and state.facts  # the state itself is unchanged
