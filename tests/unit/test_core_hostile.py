"""Hostile order and hostile values (schemas/CONTRACT.md rules 10-15): no wrong bill, no loss.

Each case was reproduced against the ledger before the rules existed; here it goes through
the shared intake step (``core.Intake``), and ``FinalLedger`` reads the rows as the views
would.
"""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import orjson
import pytest

from prism.pipeline.core import (
    CoreConfig,
    InRecord,
    Intake,
    Output,
    PermanentStoreError,
    store_isolating,
)
from tests.fixtures.final_ledger import FinalLedger
from tests.fixtures.runs import NOW, T0, RunBuilder

CFG = CoreConfig(grace_period_s=30, processing_grace=False)
USD = {"cost": "0.50", "currency": "USD"}


def records(events: Sequence[dict[str, Any]], start: int = 0) -> list[InRecord]:
    return [InRecord(orjson.dumps(e), "file:t", -1, start + i) for i, e in enumerate(events)]


def replay(*batches: Sequence[dict[str, Any]], config: CoreConfig = CFG) -> FinalLedger:
    """Feed each batch through one intake (offsets continue), finalize, read the ledger."""
    intake = Intake(config)
    ledger = FinalLedger()
    offset = 0
    for batch in batches:
        ledger.add(store_isolating(intake, {-1: records(batch, offset)}, NOW, ledger.add))
        offset += len(batch)
    ledger.add(intake.finalize(NOW))
    return ledger


def usage_run(run_id: str = "r1", tenant: str = "acme") -> RunBuilder:
    """0 started, 1 turn 1, 2 usage turn 1, 3 turn 2, 4 usage turn 2, 5 finished."""
    b = RunBuilder(run_id, tenant=tenant).started()
    b.turn(1).usage(turn=1, attempt=1, inputTokens=100, outputTokens=10, **USD)
    b.turn(2).usage(turn=2, attempt=1, inputTokens=200, outputTokens=20, **USD)
    return b.finished()


def test_usage_above_a_terminal_that_arrives_later_is_retracted_from_billing() -> None:
    b = RunBuilder().started()
    b.turn(1).usage(turn=1, attempt=1, inputTokens=100, outputTokens=10, **USD)  # seq 1, 2
    b.finished()  # seq 3
    b.usage(turn=1, attempt=2, inputTokens=999, outputTokens=99, **USD)  # seq 4: post-terminal
    ev = b.events
    ledger = replay([ev[0], ev[1], ev[2], ev[4]], [ev[3]])  # seq 4 before its terminal
    assert ledger.reasons() == {"r1-e4": "post_terminal"}
    assert "r1-e4" not in ledger.event_ids()
    assert ledger.billing() == {("acme", "USD"): (100, 10, Decimal("0.5"))}
    # the retraction is a row of its own (a higher version), never a mutation
    stored = ledger.tables["usage"]
    assert [u.retracted for k, u in stored.items() if k[2] == "r1-e4"] == [True]
    assert ledger.status("r1") == "succeeded"


def test_a_terminal_first_then_post_terminal_usage_is_never_billed() -> None:
    b = usage_run()
    b.usage(turn=3, attempt=1, inputTokens=5, **USD)  # seq 6
    ledger = replay(b.events[:6], b.events[6:])
    assert ledger.reasons() == {"r1-e6": "post_terminal"}
    assert ledger.billing() == {("acme", "USD"): (300, 30, Decimal("1.0"))}


def test_a_huge_seq_is_stored_as_one_gap_range_in_bounded_time_and_memory() -> None:
    b = RunBuilder().started()
    b.add("tool_call_finished", {"turn": 1, "tool": "t", "callIdHash": "h", "durationMs": 1,
                                 "ok": True}, seq=10_000_000)  # fmt: skip
    tracemalloc.start()
    started = time.perf_counter()
    ledger = replay(b.events)
    elapsed = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    run = ledger.tables["runs"][("r1",)]
    assert (run.missing_ranges, run.missing_count) == ([(1, 9_999_999)], 9_999_999)
    assert peak < 50 << 20 and elapsed < 30  # generous: a range list of 10^7 took 1 GB


def test_many_gaps_are_bounded_in_the_row_and_counted_in_full() -> None:
    b = RunBuilder().started()
    for seq in range(2, 400, 2):
        b.add("run_resumed", {}, seq=seq)
    run = replay(b.events).tables["runs"][("r1",)]
    assert len(run.missing_ranges) == 64 and run.missing_count == 199
    assert run.missing_ranges[:2] == [(1, 1), (3, 3)]


def test_a_future_clock_is_applied_but_moves_no_watermark() -> None:
    old = RunBuilder("old").started()  # no terminal: only event time can make it stale
    done = usage_run("done")
    skewed = RunBuilder("skewed", start=datetime(2199, 1, 1, tzinfo=UTC)).started().finished()
    later = done.events[0] | {"eventId": "dup-late-id"}  # would be billed if "done" expired
    ledger = replay(old.events + done.events, skewed.events, [later])
    run = ledger.tables["runs"][("skewed",)]
    assert run.clock_skew and run.status == "succeeded"
    assert not ledger.tables["runs"][("done",)].clock_skew
    assert ledger.status("old") == "running"  # not made stale by the year 2199
    assert ledger.billing() == {("acme", "USD"): (300, 30, Decimal("1.0"))}


def test_a_late_tenant_restates_earlier_rows_and_nothing_is_billed_to_no_tenant() -> None:
    b = usage_run()
    for ev in b.events[:4]:
        del ev["tenantId"]  # the tenant arrives with seq 4 only
    ledger = replay(b.events[:3], b.events[3:])
    assert ledger.billing() == {("acme", "USD"): (300, 30, Decimal("1.0"))}
    assert {e.tenant_id for e in ledger.rows("events")} == {"acme"}
    assert {t.tenant_id for t in ledger.rows("turns")} == {"acme"}


def test_a_second_report_of_one_turn_attempt_is_quarantined_and_billed_once() -> None:
    b = RunBuilder().started()
    b.turn(1).usage(turn=1, attempt=1, inputTokens=100, outputTokens=10, **USD)  # seq 1, 2
    b.usage(turn=1, attempt=1, inputTokens=100, outputTokens=10, **USD)  # seq 3: resent
    b.finished()
    ledger = replay(b.events[:3], b.events[3:])
    assert ledger.reasons() == {"r1-e3": "duplicate_usage"}
    assert ledger.billing() == {("acme", "USD"): (100, 10, Decimal("0.5"))}
    # the lower seq wins whatever the order: delivering the resend first changes nothing
    first = replay([b.events[3]], b.events)
    assert first.reasons() == {"r1-e3": "duplicate_usage"}
    assert first.snapshot() == ledger.snapshot()


def test_a_reused_entry_id_is_a_duplicate_usage() -> None:
    b = RunBuilder().started()
    for turn in (1, 2):
        usage = {"inputTokens": 100, **USD}
        b.add("usage_recorded", {"scope": "provider_turn", "turn": turn, "attempt": 1,
                                 "entryId": "u-1", "usage": usage})  # fmt: skip
    ledger = replay(b.events)
    assert ledger.reasons() == {"r1-e2": "duplicate_usage"}


def test_usage_mismatch_needs_both_scopes() -> None:
    only_total = RunBuilder().started().usage("run_total", inputTokens=5).finished()
    assert not replay(only_total.events).tables["runs"][("r1",)].usage_mismatch
    both = RunBuilder("r2").started()
    both.usage(turn=1, attempt=1, inputTokens=100).usage("run_total", inputTokens=5).finished()
    assert replay(both.events).tables["runs"][("r2",)].usage_mismatch


def test_another_tenant_reusing_a_run_id_changes_nothing_of_it() -> None:
    mine = usage_run("shared", tenant="acme")
    theirs = RunBuilder("shared", tenant="evil", start=T0 + timedelta(minutes=5)).started()
    theirs.usage(turn=1, attempt=1, inputTokens=10**6, **USD).finished()
    for i, ev in enumerate(theirs.events):
        ev["eventId"] = f"0-evil-{i}"  # ids that sort first change nothing either
    # the run exists (its first event arrived): whatever the order of the rest
    for order in (
        [mine.events, theirs.events],
        [mine.events[:1], theirs.events, mine.events[1:]],
        [mine.events[:1], theirs.events[::-1], mine.events[:0:-1]],
    ):
        ledger = replay(*order)
        assert ledger.reasons() == dict.fromkeys(
            (e["eventId"] for e in theirs.events), "tenant_mismatch"
        )
        assert ledger.billing() == {("acme", "USD"): (300, 30, Decimal("1.0"))}
        assert ledger.status("shared") == "succeeded"
        assert {q.tenant_id for q in ledger.rows("quarantine")} == {"evil"}


def test_a_run_whose_early_events_omit_the_tenant_cannot_be_taken_over() -> None:
    mine = usage_run("shared", tenant="acme")
    for ev in mine.events[:3]:
        del ev["tenantId"]
    evil = RunBuilder("shared", tenant="evil").started()
    evil.events[0]["eventId"] = "0-evil"
    ledger = replay(mine.events[:3], evil.events, mine.events[3:])
    # seq 0 was taken first by the run itself: the intruder's seq 0 changes nothing
    assert ledger.reasons() == {"0-evil": "duplicate_seq"}
    assert ledger.billing() == {("acme", "USD"): (300, 30, Decimal("1.0"))}


def test_a_different_event_at_a_taken_seq_is_quarantined_not_dropped() -> None:
    b = usage_run()
    rival = b.events[3] | {"eventId": "zz-rival"}
    ledger = replay(b.events[:4], [rival], b.events[4:])
    assert ledger.reasons() == {"zz-rival": "duplicate_seq"}
    assert len(ledger.rows("turns")) == 2


def test_a_poison_record_is_isolated_and_the_rest_is_stored() -> None:
    b = usage_run()
    ledger = FinalLedger()
    refused: list[int] = []

    def store(out: Output) -> None:
        if any(u.event_id == "r1-e4" for u in out.ledger.usage):
            refused.append(len(out.ledger.usage))
            raise PermanentStoreError("Cannot parse input: value too large for Int64")
        ledger.add(out)

    intake = Intake(CFG)
    out = store_isolating(intake, {-1: records(b.events)}, NOW, store)
    assert refused  # the whole batch, then halves, until the event stood alone
    assert [(d.offset, d.code) for d in out.ledger.dead_letters] == [(4, "unstorable")]
    assert "value too large" in out.ledger.dead_letters[0].reason
    assert [r.headers[1] for r in out.dlq] == [("reason-code", b"unstorable")]
    assert ledger.event_ids() == {f"r1-e{i}" for i in (0, 1, 2, 3, 5)}
    assert ledger.billing() == {("acme", "USD"): (100, 10, Decimal("0.5"))}
    assert intake.processor(-1).next_offset == 6


@pytest.mark.pure_core
def test_an_exception_in_the_semantics_dead_letters_that_event_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from prism.pipeline.core import _processor

    real = _processor.fact_of

    def exploding(ev: Any, *args: Any) -> Any:
        if ev.event_id == "r1-e3":
            raise RuntimeError("bug in the core")
        return real(ev, *args)

    monkeypatch.setattr(_processor, "fact_of", exploding)
    b = usage_run()
    intake = Intake(CFG)
    ledger = FinalLedger()
    out = store_isolating(intake, {-1: records(b.events)}, NOW, ledger.add)
    assert [(d.offset, d.code) for d in out.ledger.dead_letters] == [(3, "internal_error")]
    assert "RuntimeError: bug in the core" in out.ledger.dead_letters[0].reason
    assert ledger.event_ids() == {f"r1-e{i}" for i in (0, 1, 2, 4, 5)}


def test_rollback_restores_the_state_before_the_step() -> None:
    b = usage_run()
    intake = Intake(CFG)
    first = intake.step(-1, records(b.events[:3]), NOW)
    intake.commit(-1)
    before = {k: v for k, v in first.state_writes.items() if v is not None}
    intake.step(-1, records(b.events[3:], 3), NOW)
    intake.rollback(-1)
    proc = intake.processor(-1)
    assert proc.next_offset == 3 and proc.runs["r1"].to_bytes() == before[proc.run_key("r1")]
    again = intake.step(-1, records(b.events[3:], 3), NOW)  # nothing of it was lost
    assert again.stats["applied"] == 3


def test_content_in_an_unknown_type_never_reaches_the_ledger() -> None:
    b = RunBuilder().started()
    data = {"step": 3, "arguments": {"q": "secret plan"}, "result": "the answer",
            "apiKey": "sk-live-1", "nested": {"prompt": "hi", "ok": True}}  # fmt: skip
    b.add("vendor_trace", data)
    ledger = replay(b.events)
    [raw] = [e for e in ledger.rows("events") if e.type == "vendor_trace"]
    assert orjson.loads(raw.payload) == {"step": 3, "nested": {"ok": True}}
