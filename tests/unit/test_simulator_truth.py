"""Manifest rules for hostile producers, on small fleets whose answers are worked out by hand."""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

from prism.runtime.simulator import FleetConfig
from prism.runtime.simulator._expected_alerts import exhaustion_alerts
from prism.runtime.simulator._manifest import compute_manifest
from tests.unit.test_simulator_manifest import T0, Runs, row, turn

PRICED = {"inputTokens": 1000, "outputTokens": 100, "totalTokens": 1100, "cost": "0.100000",
          "currency": "USD"}  # fmt: skip


def manifest(f: Runs, **config: Any) -> dict[str, Any]:
    return compute_manifest(f.records, FleetConfig(runs=1, **config))


def test_late_tenant_is_inherited_by_the_events_before_it() -> None:
    f = Runs()
    early = [
        f.event("L", 0, "agent_started"),
        f.event("L", 1, "usage_recorded", row(1, PRICED), at=1),
    ]
    for ev in early:
        del ev["tenantId"]
        f.add(ev)
    owner = f.event("L", 2, "tool_call_finished", {"turn": 1}, at=2, tenant="acme")
    owner["accountId"], owner["userId"] = "acct-1", "usr-1"
    f.add(owner)
    f.emit("L", 3, "agent_finished", at=3, tenant="acme")
    m = manifest(f)
    run = m["runs"]["L"]
    assert (run["tenant_id"], run["account_id"], run["user_id"]) == ("acme", "acct-1", "usr-1")
    assert m["quarantine"]["tenant_mismatch"] == 0
    assert list(m["tenants"]) == ["acme"]  # nothing billed to a missing tenant
    assert m["tenants"]["acme"]["billable"]["cost"] == {"USD": "0.100000"}


def test_another_tenant_reusing_a_run_id_changes_nothing_of_the_run() -> None:
    f = Runs()
    f.emit("R", 0, "agent_started", tenant="acme", event_id="a0")
    f.emit("R", 1, "usage_recorded", row(1, PRICED), at=1, tenant="acme", event_id="a1")
    f.emit("R", 2, "agent_finished", at=2, tenant="acme", event_id="a2")
    # The intruder starts later: its own seqs from 0, its eventIds sort after the owner's.
    f.emit("R", 0, "agent_started", at=60, tenant="globex", event_id="b0")
    f.emit("R", 1, "usage_recorded", row(1, PRICED), at=61, tenant="globex", event_id="b1")
    f.emit("R", 2, "usage_recorded", row(2, PRICED), at=62, tenant="globex", event_id="b2")
    f.emit("R", 3, "error", {"error": {"code": "X", "message": "m"}}, at=63, tenant="globex",
           event_id="b3")  # fmt: skip
    first = manifest(f)
    run = first["runs"]["R"]
    assert (run["tenant_id"], run["status"], run["missing_seqs"]) == ("acme", "succeeded", [])
    assert first["quarantine"]["tenant_mismatch"] == 4
    assert {first["quarantined_events"][e] for e in ("b0", "b1", "b2", "b3")} == {"tenant_mismatch"}
    assert "globex" not in first["tenants"]
    assert first["tenants"]["acme"]["billable"]["rows"] == 1
    rng = random.Random(5)
    owners_first, rest = f.records[:1], f.records[1:]
    for _ in range(20):  # the run exists; the rest interleaved in any order: same truth
        rng.shuffle(rest)
        f.records = owners_first + rest
        again = manifest(f)
        assert {k: again[k] for k in ("runs", "tenants", "quarantine", "quarantined_events")} == {
            k: first[k] for k in ("runs", "tenants", "quarantine", "quarantined_events")
        }


def test_a_higher_seq_delivered_before_the_terminal_is_post_terminal_and_never_billed() -> None:
    f = Runs()
    f.emit("P", 0, "agent_started")
    f.emit("P", 1, "provider_turn_finished", turn(1), at=1)
    f.emit("P", 2, "usage_recorded", row(1, PRICED), at=2)
    late = f.emit("P", 4, "usage_recorded", row(2, {**PRICED, "cost": "9.000000"}), at=4)
    f.emit("P", 3, "agent_finished", at=3)  # delivered after seq 4
    m = manifest(f)
    assert m["runs"]["P"]["status"] == "succeeded"
    assert m["quarantined_events"] == {late["eventId"]: "post_terminal"}
    assert m["tenants"]["acme"]["billable"]["cost"] == {"USD": "0.100000"}
    assert m["runs"]["P"]["missing_seqs"] == []


def test_per_seq_the_smaller_event_id_holds_the_seq_whatever_arrives_first() -> None:
    for first, second in (("s1-b", "s1-a"), ("s1-a", "s1-b")):
        f = Runs()
        f.emit("S", 0, "agent_started", event_id="s0")
        cost = {"s1-b": {**PRICED, "cost": "0.500000"}, "s1-a": PRICED}
        f.emit("S", 1, "usage_recorded", row(1, cost[first]), at=1, event_id=first)
        f.emit("S", 1, "usage_recorded", row(1, cost[second]), at=1, event_id=second)
        f.emit("S", 2, "agent_finished", at=2, event_id="s2")
        m = manifest(f)
        assert m["quarantined_events"] == {"s1-b": "duplicate_seq"}
        assert m["tenants"]["acme"]["billable"]["cost"] == {"USD": PRICED["cost"]}


def test_one_reported_usage_per_turn_attempt() -> None:
    f = Runs()
    f.emit("U", 0, "agent_started")
    first = {"scope": "provider_turn", "turn": 1, "attempt": 1, "entryId": "ule-1", "usage": PRICED}
    f.emit("U", 1, "usage_recorded", first, at=1)
    again = f.emit("U", 2, "usage_recorded", {**first, "entryId": "ule-2"}, at=2)  # same turn
    resent = f.emit("U", 3, "usage_recorded", {**first, "turn": 2}, at=3)  # same entryId
    estimate = {"inputTokens": 900, "totalTokens": 900, "estimated": True, "confidence": "low"}
    f.emit("U", 4, "usage_recorded", row(1, estimate), at=4)  # superseded, not a duplicate
    f.emit("U", 5, "usage_recorded", {"scope": "run_total", "usage": {"inputTokens": 1000}}, at=5)
    f.emit("U", 6, "agent_finished", at=6)
    m = manifest(f)
    assert m["quarantined_events"] == {
        again["eventId"]: "duplicate_usage",
        resent["eventId"]: "duplicate_usage",
    }
    bill = m["tenants"]["acme"]["billable"]
    assert (bill["rows"], bill["input_tokens"], bill["cost"]) == (1, 1000, {"USD": "0.100000"})
    assert m["tenants"]["acme"]["estimated"]["rows"] == 0
    assert m["runs"]["U"]["usage_mismatch"] is False  # run_total equals the one billed row


def test_usage_mismatch_needs_both_a_run_total_and_provider_rows() -> None:
    f = Runs()
    f.emit("T", 0, "usage_recorded", {"scope": "run_total", "usage": {"inputTokens": 5}})
    f.emit("T", 1, "agent_finished", at=1)
    f.emit("V", 0, "usage_recorded", row(1, PRICED))
    f.emit("V", 1, "usage_recorded", {"scope": "run_total", "usage": {"inputTokens": 5}}, at=1)
    runs = manifest(f)["runs"]
    assert runs["T"]["usage_mismatch"] is False
    assert runs["V"]["usage_mismatch"] is True


def test_a_skewed_clock_cannot_push_the_watermark_or_expire_other_runs() -> None:
    f = Runs()
    f.emit("Q", 0, "agent_started", at=600)  # idle since T0 + 10 min
    f.emit("R", 0, "agent_started", at=3000)  # idle since T0 + 50 min
    f.emit("N", 0, "agent_started", at=3500)
    skewed = f.event("S", 0, "agent_started", at=3550)
    skewed["ts"] = "2199-06-01T00:00:00+00:00"
    f.add(skewed)
    clock = T0 + timedelta(hours=1)
    m = manifest(f, processing_clock=clock, stale_after_seconds=1800)
    assert m["watermark"] == "2026-11-30T00:58:20.000+00:00"  # the latest unskewed event
    assert m["params"]["processing_clock"] == "2026-11-30T01:00:00.000+00:00"
    runs = m["runs"]
    assert runs["S"]["clock_skew"] is True and runs["S"]["status"] == "running"
    assert not any(runs[r]["clock_skew"] for r in "QRN")
    assert runs["Q"]["status"] == "incomplete"
    assert runs["R"]["status"] == "running"  # would be incomplete at a 2199 watermark
    assert m["alerts"]["stale_run"] == ["Q"]


def test_default_processing_clock_is_the_last_delivery() -> None:
    f = Runs()
    f.emit("A", 0, "agent_started", at=10)
    f.emit("A", 1, "agent_finished", at=70)
    m = manifest(f)
    assert m["params"]["processing_clock"] == "2026-11-30T00:01:10.000+00:00"
    assert m["runs"]["A"]["clock_skew"] is False


def test_guardrail_denials_count_only_accepted_events() -> None:
    f = Runs()
    f.emit("G", 0, "agent_started")
    deny = {"turn": 1, "tool": "shell", "rule": "pack:destructive-commands/no-force-push",
            "stage": "before_tool"}  # fmt: skip
    f.emit("G", 1, "guardrail_denied", deny, at=1)
    f.emit("G", 2, "guardrail_denied", {**deny, "rule": "pack:secrets-hygiene/x",
                                        "stage": "after_tool"}, at=2)  # fmt: skip
    f.emit("G", 3, "agent_finished", at=3)
    f.emit("G", 4, "guardrail_denied", deny, at=4)  # post-terminal: not counted
    m = manifest(f)
    assert m["guardrails"] == {
        "denials": 2,
        "by_pack": {"destructive-commands": 1, "secrets-hygiene": 1},
        "by_rule": {"pack:destructive-commands/no-force-push": 1, "pack:secrets-hygiene/x": 1},
        "by_stage": {"after_tool": 1, "before_tool": 1},
    }
    assert m["runs"]["G"]["guardrail_denials"] == 2


def test_estimates_are_reported_by_confidence() -> None:
    f = Runs()
    low = {"inputTokens": 10, "outputTokens": 1, "totalTokens": 11, "estimated": True,
           "confidence": "low"}  # fmt: skip
    f.emit("E", 0, "usage_recorded", row(1, low))
    f.emit("E", 1, "usage_recorded", row(2, {**low, "confidence": "medium", "totalTokens": 20}))
    f.emit("E", 2, "usage_recorded", row(3, low))
    f.emit("E", 3, "usage_recorded", row(3, PRICED))  # supersedes the turn-3 estimate
    assert manifest(f)["estimates"]["by_confidence"] == {
        "low": {"rows": 1, "input_tokens": 10, "output_tokens": 1, "total_tokens": 11},
        "medium": {"rows": 1, "input_tokens": 10, "output_tokens": 1, "total_tokens": 20},
    }


def _limit_death(
    f: Runs, run: str, at: float, tenant: str = "acme", axis: str = "maxTurns"
) -> None:
    f.emit(run, 0, "agent_started", at=at - 2, tenant=tenant)
    f.emit(run, 1, "run_limit_exceeded", {"limit": axis, "maximum": 1, "observed": 2}, at=at - 1,
           tenant=tenant)  # fmt: skip
    f.emit(run, 2, "error", {"error": {"code": "RUN_LIMIT_EXCEEDED", "message": "m"}}, at=at,
           tenant=tenant)  # fmt: skip


def test_exhaustion_alerts_fire_once_per_burst_per_tenant_and_axis() -> None:
    f = Runs()
    for n in range(6):  # 6 deaths 50 s apart: fires at the 5th (t = 200 s)
        _limit_death(f, f"b{n}", at=100 + 50 * n)
    for n in range(5):  # a second burst after the first left the window
        _limit_death(f, f"c{n}", at=2000 + 10 * n)
    for n in range(4):  # another tenant: below the threshold
        _limit_death(f, f"g{n}", at=100 + n, tenant="globex")
    for n in range(3):  # another axis of the same tenant does not add up
        _limit_death(f, f"w{n}", at=150 + n, axis="maxWallMs")
    f.emit("ok", 0, "agent_started", at=3000)
    alerts = manifest(f)["alerts"]["run_limit_exhaustion"]
    assert [(a["tenant_id"], a["key"], a["fired_at"], a["count"]) for a in alerts] == [
        ("acme", "maxTurns", "2026-11-30T00:05:00+00:00", 5),
        ("acme", "maxTurns", "2026-11-30T00:34:00+00:00", 5),
    ]
    assert alerts[0]["run_ids"] == ["b0", "b1", "b2", "b3", "b4"]
    assert alerts[0]["alert_id"] == "run_limit_exhaustion:acme:maxTurns:2026-11-30T00:05:00+00:00"


def test_the_window_is_half_open() -> None:
    # Deaths at 0, 100, 200 and 300 s: at t = 300 s the death at 0 has left (t - 300, t].
    deaths = [("t", "maxTurns", f"r{n}", ms) for n, ms in enumerate((0, 100_000, 200_000, 300_000))]
    assert exhaustion_alerts(deaths, 300_000, 4) == []
    deaths.append(("t", "maxTurns", "r9", 299_999))
    (alert,) = exhaustion_alerts(deaths, 300_000, 4)
    assert alert["count"] == 4 and alert["run_ids"] == ["r0", "r1", "r2", "r9"]
    assert alert["fired_at"] == "1970-01-01T00:04:59.999000+00:00"
