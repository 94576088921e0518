"""Ground-truth manifest rules, checked on small fleets whose answers are worked out by hand."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from prism.runtime.simulator import FleetConfig, FleetRecord, simulate
from prism.runtime.simulator._manifest import compute_manifest

T0 = datetime(2026, 11, 30, tzinfo=UTC)


class Runs:
    """Builds hand-written records: events with per-run seq and explicit timestamps."""

    def __init__(self) -> None:
        self.records: list[FleetRecord] = []
        self._n = 0

    def event(
        self,
        run: str,
        seq: int,
        type_: str,
        data: dict[str, Any] | None = None,
        *,
        at: float = 0.0,
        tenant: str = "acme",
        model: str = "claude",
        event_id: str | None = None,
        parent: str | None = None,
    ) -> dict[str, Any]:
        self._n += 1
        ts = T0 + timedelta(seconds=at)
        ev: dict[str, Any] = {
            "schema": "prism.agent-event/v1",
            "eventId": event_id or f"e{self._n}",
            "runId": run,
            "seq": seq,
            "type": type_,
            "ts": ts.isoformat(),
            "tenantId": tenant,
            "model": {"provider": "anthropic", "model": model},
            "data": data or {},
        }
        if parent:
            ev["parent"] = {"runId": parent, "delegationId": "d1"}
        return ev

    def add(self, ev: dict[str, Any], kind: str = "valid") -> dict[str, Any]:
        ms = int(datetime.fromisoformat(ev["ts"]).timestamp() * 1000)
        value = orjson.dumps(ev) if kind == "valid" else b"{not json"
        self.records.append(
            FleetRecord(ev["runId"].encode(), value, (), kind, ms, ev if kind == "valid" else None)
        )
        return ev

    def emit(self, *args: Any, kind: str = "valid", **kwargs: Any) -> dict[str, Any]:
        return self.add(self.event(*args, **kwargs), kind)

    def manifest(self, stale_after: float = 3600.0) -> dict[str, Any]:
        return compute_manifest(self.records, FleetConfig(runs=1, stale_after_seconds=stale_after))


def turn(
    n: int,
    attempt: int = 1,
    usage: dict[str, Any] | None = None,
    cache: dict[str, Any] | None = None,
    budget_input: int | None = None,
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "turn": n,
        "attempt": attempt,
        "latencyMs": 900,
        "stopReason": "end_turn",
        "budgets": {"runInputUsed": 0, "turns": n, "maxTurns": 10},
        "tools": {"count": 1, "idsHash": "abc"},
    }
    if budget_input is not None:
        data["budgets"]["inputTokens"] = budget_input
    if usage is not None:
        data["usage"] = usage
    if cache is not None:
        data["cache"] = cache
    return data


def row(n: int, usage: dict[str, Any], attempt: int = 1) -> dict[str, Any]:
    return {"scope": "provider_turn", "turn": n, "attempt": attempt, "usage": usage}


def test_gap_duplicates_and_post_terminal_records() -> None:
    f = Runs()
    f.emit("A", 0, "agent_started", at=0)
    reported = {
        "inputTokens": 1000,
        "outputTokens": 200,
        "totalTokens": 1200,
        "cacheReadTokens": 400,
        "cacheWriteTokens": 100,
        "cost": "0.010000",
        "currency": "USD",
    }
    t1 = f.emit(
        "A",
        1,
        "provider_turn_finished",
        turn(1, usage=reported, cache={"cacheReadTokens": 400}),
        at=1,
    )
    u1 = f.emit("A", 2, "usage_recorded", row(1, reported), at=2)
    f.emit("A", 3, "tool_call_finished", {"turn": 1}, at=3, kind="unparsable")  # a gap
    f.add(dict(u1))  # identical duplicate
    # Same (runId, seq) under a new eventId: "e2" < "re-emitted" holds seq 1, the other is
    # quarantined duplicate_seq.
    f.add({**t1, "eventId": "re-emitted"})
    f.emit("A", 4, "deterministic_turn_finished", {"turn": 2, "middleware": "faq"}, at=4)
    f.emit("A", 5, "agent_finished", {"stopReason": "host_policy"}, at=5)
    f.emit("A", 6, "usage_recorded", row(3, reported), at=6)  # post-terminal: never billed
    noise = f.emit("A", 7, "error", {"error": {"code": "X", "message": "late"}}, at=7)
    f.add(dict(noise))  # the same conflicting terminal delivered twice counts once

    m = f.manifest()
    run = m["runs"]["A"]
    assert run["status"] == "succeeded" and run["terminal_type"] == "agent_finished"
    assert run["stop_reason"] == "host_policy" and run["failure_class"] is None
    assert (run["model_turns"], run["deterministic_turns"]) == (1, 1)
    assert run["cache_hit_rate"] == 0.4
    assert run["missing_seqs"] == [3]
    assert run["usage_mismatch"] is False and run["exhaustion"] is None
    assert m["counts"] == {
        "records": 11,
        "valid_records": 10,
        "duplicates": 2,
        "unique_events": 8,
        "applied_events": 5,
        "quarantined_events": 3,
    }
    assert m["dlq"] == {"unparsable": 1, "contract_violation": 0, "oversized": 0}
    assert m["quarantine"] == {
        "post_terminal": 1,
        "conflicting_terminal": 1,
        "duplicate_seq": 1,
        "tenant_mismatch": 0,
        "duplicate_usage": 0,
    }
    assert m["quarantined_events"] == {"re-emitted": "duplicate_seq", "e7": "post_terminal",
                                      "e8": "conflicting_terminal"}  # fmt: skip
    bill = m["tenants"]["acme"]["billable"]
    assert bill == {
        "input_tokens": 1000,
        "output_tokens": 200,
        "total_tokens": 1200,
        "cache_read_tokens": 400,
        "cache_write_tokens": 100,
        "rows": 1,
        "cost": {"USD": "0.010000"},
    }


def test_replaced_priced_estimate_leaves_a_gap_and_a_usage_mismatch() -> None:
    f = Runs()
    f.emit("B", 0, "agent_started")
    est1 = {
        "inputTokens": 500,
        "outputTokens": 50,
        "totalTokens": 550,
        "estimated": True,
        "confidence": "medium",
    }
    est2 = {
        "inputTokens": 700,
        "outputTokens": 70,
        "totalTokens": 770,
        "estimated": True,
        "confidence": "low",
    }
    f.emit("B", 1, "provider_turn_finished", turn(1, usage=est1), at=1)
    f.emit(
        "B", 2, "usage_recorded", row(1, {**est1, "cost": "0.1"}), at=2, kind="contract_violation"
    )
    f.emit("B", 3, "provider_turn_finished", turn(2, usage=est2), at=3)
    f.emit("B", 4, "usage_recorded", row(2, est2), at=4)
    total = {
        "inputTokens": 1200,
        "outputTokens": 120,
        "totalTokens": 1320,
        "estimated": True,
        "confidence": "low",
    }
    f.emit("B", 5, "usage_recorded", {"scope": "run_total", "usage": total}, at=5)
    f.emit("B", 6, "agent_finished", {"finishReason": "stop"}, at=6)

    m = f.manifest()
    run = m["runs"]["B"]
    assert run["missing_seqs"] == [2]
    assert run["usage_mismatch"] is True  # the run total still counts the lost row
    assert run["cache_hit_rate"] is None and run["model_turns"] == 2
    assert m["dlq"]["contract_violation"] == 1
    tenant = m["tenants"]["acme"]
    assert tenant["billable"]["rows"] == 0 and tenant["billable"]["cost"] == {}
    assert tenant["estimated"] == {
        "input_tokens": 700,
        "output_tokens": 70,
        "total_tokens": 770,
        "rows": 1,
        "by_confidence": {"medium": 0, "low": 770},
    }


def test_report_supersedes_estimate_and_run_total_matches_effective_rows() -> None:
    f = Runs()
    f.emit("C", 0, "agent_started", tenant="umbrella")
    est = {
        "inputTokens": 900,
        "outputTokens": 90,
        "totalTokens": 990,
        "estimated": True,
        "confidence": "medium",
    }
    rep = {
        "inputTokens": 1000,
        "outputTokens": 100,
        "totalTokens": 1100,
        "cost": "0.200000",
        "currency": "EUR",
    }
    rep2 = {**rep, "cost": "0.150000"}
    f.emit("C", 1, "usage_recorded", row(1, est), tenant="umbrella", at=1)
    f.emit("C", 2, "usage_recorded", row(2, rep2), tenant="umbrella", at=2)
    f.emit("C", 3, "usage_recorded", row(1, rep), tenant="umbrella", at=3)
    total = {"inputTokens": 2000, "totalTokens": 2200}
    f.emit("C", 4, "usage_recorded", {"scope": "run_total", "usage": total}, tenant="umbrella")
    f.emit("C", 5, "agent_denied", {"reason": "policy"}, tenant="umbrella", at=5)

    m = f.manifest()
    assert m["runs"]["C"]["status"] == "denied"
    assert m["runs"]["C"]["usage_mismatch"] is False
    t = m["tenants"]["umbrella"]
    assert t["billable"]["rows"] == 2 and t["billable"]["cost"] == {"EUR": "0.350000"}
    assert t["billable"]["total_tokens"] == 2200
    assert t["estimated"]["rows"] == 0  # superseded by the report for turn 1, attempt 1
    assert m["by_model"] == [
        {
            "tenant_id": "umbrella",
            "provider": "anthropic",
            "model": "claude",
            "currency": "EUR",
            **t,
        }
    ]


def test_open_runs_are_incomplete_suspended_or_running() -> None:
    f = Runs()
    hour = 3600.0
    f.emit("stale", 0, "agent_started", at=0)
    f.emit("stale", 1, "run_suspended", at=10)
    f.emit("susp", 0, "agent_started", at=3 * hour - 60)
    f.emit("susp", 1, "run_suspended", at=3 * hour - 50)
    f.emit("back", 0, "agent_started", at=3 * hour - 40)
    f.emit("back", 2, "run_resumed", at=3 * hour - 20)
    f.emit("back", 1, "run_suspended", at=3 * hour - 30)  # late, lower seq
    f.emit("edge", 0, "agent_started", at=2 * hour)  # exactly stale_after old: not stale
    f.emit("last", 0, "agent_started", at=3 * hour)

    m = f.manifest()
    runs = m["runs"]
    assert m["watermark"] == "2026-11-30T03:00:00.000+00:00"
    assert runs["stale"]["status"] == "incomplete"
    assert runs["susp"]["status"] == "suspended"
    assert runs["back"]["status"] == "running"
    assert runs["edge"]["status"] == "running"
    assert runs["back"]["missing_seqs"] == []
    assert runs["stale"]["terminal_type"] is None
    assert f.manifest(stale_after=7 * hour)["runs"]["stale"]["status"] == "suspended"


def test_limit_deaths_failures_and_aborts() -> None:
    f = Runs()
    f.emit("L", 0, "agent_started")
    f.emit("L", 1, "run_limit_exceeded", {"limit": "maxTurns", "maximum": 3, "observed": 4})
    f.emit(
        "L",
        2,
        "budget_exhausted",
        {"axis": "maxTurns", "counters": {}, "closest": [], "lastToolCallHashes": []},
    )
    f.emit("L", 3, "error", {"error": {"code": "RUN_LIMIT_EXCEEDED", "message": "m"}})
    f.emit("H", 0, "agent_started")
    f.emit("H", 1, "run_limit_exceeded", {"limit": "maxCost"}, kind="oversized")
    f.emit(
        "H",
        2,
        "budget_exhausted",
        {"axis": "maxCost", "counters": {}, "closest": [], "lastToolCallHashes": []},
    )
    f.emit("P", 0, "agent_started")
    f.emit("P", 1, "error", {"error": {"code": "Q", "message": "m", "failureClass": "quota"}})
    f.emit("X", 0, "agent_started")
    f.emit(
        "X",
        1,
        "error",
        {"error": {"code": "A", "message": "m"}, "aborted": True, "abortReason": "user_cancelled"},
    )

    runs = f.manifest()["runs"]
    assert runs["L"]["status"] == "failed" and runs["L"]["failure_class"] is None
    assert runs["L"]["exhaustion"] == {
        "limit": "maxTurns",
        "maximum": 3,
        "observed": 4,
        "axis": "maxTurns",
    }
    assert runs["H"]["status"] == "running"  # a limit record alone does not close a run
    assert runs["H"]["exhaustion"] == {
        "limit": None,
        "maximum": None,
        "observed": None,
        "axis": "maxCost",
    }
    assert runs["H"]["missing_seqs"] == [1]
    assert runs["P"]["status"] == "failed" and runs["P"]["failure_class"] == "quota"
    assert runs["X"]["status"] == "aborted" and runs["X"]["terminal_type"] == "error"


def test_cache_hit_rate_rules() -> None:
    f = Runs()
    zeros = {"inputTokens": 100, "cacheReadTokens": 0}
    f.emit("Z", 0, "provider_turn_finished", turn(1, usage=zeros, cache={"cacheReadTokens": 0}))
    f.emit("N", 0, "provider_turn_finished", turn(1, usage={"inputTokens": 100}))
    # Cache read from data.cache, input from budgets when usage is absent; every attempt counts.
    f.emit(
        "W", 0, "provider_turn_finished", turn(1, cache={"cacheReadTokens": 30}, budget_input=100)
    )
    f.emit(
        "W",
        1,
        "provider_turn_finished",
        turn(1, attempt=2, usage={"inputTokens": 300, "cacheReadTokens": 270}),
    )
    f.emit("W", 2, "provider_turn_finished", turn(2, usage={"inputTokens": 50}))
    f.emit(
        "E", 0, "provider_turn_finished", turn(1, usage={"inputTokens": 0, "cacheReadTokens": 0})
    )
    runs = f.manifest()["runs"]
    assert runs["Z"]["cache_hit_rate"] == 0.0
    assert runs["N"]["cache_hit_rate"] is None
    assert runs["W"]["cache_hit_rate"] == 0.75 and runs["W"]["model_turns"] == 2
    assert runs["E"]["cache_hit_rate"] is None  # input sum 0


def test_oversized_replacements_are_the_missing_seqs() -> None:
    fleet = simulate(FleetConfig(runs=40, seed=9, oversized=1.0))
    replaced = {
        (r.event["runId"], r.event["seq"])
        for r in fleet.records
        if r.kind == "oversized" and r.event is not None
    }
    runs = fleet.manifest["runs"]
    missing = {(rid, seq) for rid, run in runs.items() for seq in run["missing_seqs"]}
    # A replaced last event of a run that never finished is not a gap (nothing follows it).
    assert missing and missing <= replaced
    delivered: dict[str, int] = {}
    for ev in fleet.events:
        delivered[ev["runId"]] = max(delivered.get(ev["runId"], -1), ev["seq"])
    for rid, seq in replaced - missing:
        assert runs[rid]["terminal_type"] is None and seq > delivered[rid]
    oversized = [r for r in fleet.records if r.kind == "oversized"]
    assert fleet.manifest["dlq"]["oversized"] == len(oversized) == len(replaced)
    assert len(replaced) >= 30  # nearly every run has an event to replace at p=1
    assert all(len(r.value) > fleet.config.max_event_bytes for r in oversized)


def test_malformed_replacements_open_gaps_and_go_to_the_dlq() -> None:
    fleet = simulate(FleetConfig(runs=40, seed=9, malformed=1.0))
    junk = [r for r in fleet.records if r.kind in ("unparsable", "contract_violation")]
    replacing = [r for r in junk if not r.note.endswith("(extra)")]
    m = fleet.manifest
    assert m["dlq"]["unparsable"] + m["dlq"]["contract_violation"] == len(junk)
    gaps = sum(len(run["missing_seqs"]) for run in m["runs"].values())
    assert 0 < gaps <= len(replacing)
    assert m["counts"]["records"] == len(fleet.records) == m["counts"]["valid_records"] + len(junk)
