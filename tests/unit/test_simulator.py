"""The fleet simulator: determinism, scenario coverage, chaos shapes, JSONL output."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from datetime import datetime
from typing import Any

import pytest

import prism.runtime.simulator as simulator
from prism.runtime.simulator import (
    Fleet,
    FleetConfig,
    SimulatorConfigError,
    SimulatorError,
    simulate,
    write_jsonl,
    write_manifest,
)

ALL_CHAOS = dict(
    duplicates=0.03,
    reorder_window=3,
    post_terminal=0.05,
    conflicting_terminals=0.05,
    malformed=0.03,
    oversized=0.01,
)
TERMINALS = {"agent_finished", "agent_denied", "error"}


@pytest.fixture(scope="module")
def chaos_fleet() -> Fleet:
    return simulate(FleetConfig(runs=300, seed=11, **ALL_CHAOS))


def _by_run(events: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    seen: set[str] = set()
    for ev in events:
        if ev["eventId"] not in seen:
            seen.add(ev["eventId"])
            runs[ev["runId"]].append(ev)
    for evs in runs.values():
        evs.sort(key=lambda e: e["seq"])
    return runs


def _ts(value: str) -> datetime:
    return datetime.fromisoformat(value)


def test_public_names_are_exported() -> None:
    for name in simulator.__all__:
        assert hasattr(simulator, name), name
    assert {
        "simulate",
        "FleetConfig",
        "Fleet",
        "write_jsonl",
        "write_manifest",
        "publish_to_kafka",
    } <= set(simulator.__all__)


def test_same_seed_gives_identical_records_and_manifest() -> None:
    config = FleetConfig(runs=120, seed=5, **ALL_CHAOS)
    a, b = simulate(config), simulate(FleetConfig(runs=120, seed=5, **ALL_CHAOS))
    assert [(r.key, r.value, r.headers) for r in a.records] == [
        (r.key, r.value, r.headers) for r in b.records
    ]
    assert a.manifest == b.manifest
    c = simulate(FleetConfig(runs=120, seed=6, **ALL_CHAOS))
    assert [r.value for r in c.records] != [r.value for r in a.records]


def test_default_start_and_event_time_span() -> None:
    fleet = simulate(FleetConfig(runs=300, seed=2))
    stamps = [_ts(ev["ts"]) for ev in fleet.events]
    assert min(stamps).isoformat().startswith("2026-11-30T00:")
    span = (max(stamps) - min(stamps)).total_seconds()
    assert 2.5 * 3600 <= span <= 3.5 * 3600
    assert all(ev["ts"].endswith("+00:00") for ev in fleet.events)


def test_without_chaos_every_record_is_valid_unique_and_in_seq_order() -> None:
    fleet = simulate(FleetConfig(runs=250, seed=3))
    m = fleet.manifest
    assert m["counts"]["records"] == m["counts"]["valid_records"] == m["counts"]["unique_events"]
    assert m["counts"]["duplicates"] == 0
    assert m["dlq"] == {"unparsable": 0, "contract_violation": 0, "oversized": 0}
    assert set(m["quarantine"].values()) == {0} and m["quarantined_events"] == {}
    assert all(run["missing_seqs"] == [] for run in m["runs"].values())
    assert not any(run["clock_skew"] for run in m["runs"].values())
    assert m["channels"] is None and m["guardrails"]["denials"] == 0
    last_seq: dict[str, int] = {}
    for ev in fleet.events:
        assert ev["seq"] == last_seq.get(ev["runId"], -1) + 1
        last_seq[ev["runId"]] = ev["seq"]
    assert len(m["runs"]) == 250


def test_every_scenario_appears_at_300_runs_with_all_chaos(chaos_fleet: Fleet) -> None:
    events = chaos_fleet.events
    m = chaos_fleet.manifest
    runs = _by_run(events)
    types = Counter(ev["type"] for ev in events)
    for type_ in (
        "tool_call_finished",
        "deterministic_turn_finished",
        "agent_denied",
        "child_milestone",
        "child_failed",
        "delegation_child_events_capped",
        "delegation_child_events_coalesced",
        "tool_narrowing_clamped",
        "extension_error",
        "run_suspended",
        "run_resumed",
        "memory_compacted",
        "run_limit_exceeded",
        "budget_exhausted",
    ):
        assert types[type_] > 0, type_
    tools = [ev["data"] for ev in events if ev["type"] == "tool_call_finished"]
    assert any(d["ok"] for d in tools) and any(not d["ok"] and d["errorCode"] for d in tools)
    assert max(r["model_turns"] for r in m["runs"].values()) >= 3

    finished = [ev["data"] for ev in events if ev["type"] == "agent_finished"]
    stops = {d.get("stopReason") for d in finished}
    assert {"host_policy", "turn_limit", "token_limit", "refusal", None} <= stops
    assert any("stopReason" not in d and d.get("finishReason") == "stop" for d in finished)
    errors = [ev["data"] for ev in events if ev["type"] == "error"]
    classes = {d["error"].get("failureClass") for d in errors}
    assert {"quota", "auth", "rate_limited", "transient", "permanent", "unknown"} <= classes
    assert any(d.get("aborted") is True and d.get("abortReason") for d in errors)

    # Limit deaths on every axis: run_limit_exceeded, then budget_exhausted, then error
    # (chaos may have replaced one of the first two; seqs still tell the order).
    axes = set()
    for evs in runs.values():
        seq_of = {e["type"]: e["seq"] for e in evs}
        if evs[-1]["type"] == "error" and (
            "run_limit_exceeded" in seq_of or "budget_exhausted" in seq_of
        ):
            error_seq = seq_of["error"]
            if "run_limit_exceeded" in seq_of:
                assert seq_of["run_limit_exceeded"] == error_seq - 2
                axes.add(next(e for e in evs if e["type"] == "run_limit_exceeded")["data"]["limit"])
            if "budget_exhausted" in seq_of:
                assert seq_of["budget_exhausted"] == error_seq - 1
                axes.add(next(e for e in evs if e["type"] == "budget_exhausted")["data"]["axis"])
    assert axes == {"maxTurns", "maxInputTokens", "maxWallMs", "maxCost"}
    statuses = Counter(r["status"] for r in m["runs"].values())
    for status in (
        "succeeded",
        "failed",
        "aborted",
        "denied",
        "incomplete",
        "running",
        "suspended",
    ):
        assert statuses[status] > 0, status
    exhausted = [r["exhaustion"] for r in m["runs"].values() if r["exhaustion"]]
    assert any(None not in e.values() for e in exhausted)


def test_prompt_cache_habits_vary_by_model(chaos_fleet: Fleet) -> None:
    habits: dict[str, set[str]] = defaultdict(set)
    for rec in chaos_fleet.records:
        ev = rec.event
        if rec.note or ev is None:  # post-terminal noise follows no model's habits
            continue
        if ev["type"] != "provider_turn_finished" or "usage" not in ev["data"]:
            continue
        usage = ev["data"]["usage"]
        if usage.get("estimated"):
            continue
        model = ev["model"]["model"]
        if "cacheReadTokens" in usage and "cacheWriteTokens" in usage:
            zero = usage["cacheReadTokens"] == usage["cacheWriteTokens"] == 0
            habits[model].add("zeros" if zero else "read_write")
        elif "cacheReadTokens" in usage:
            habits[model].add("read_only")
        else:
            habits[model].add("none")
    assert any(h == {"zeros"} for h in habits.values())  # a model that always reports zeros
    assert any(m.startswith("claude") and "read_write" in h for m, h in habits.items())
    assert any(m.startswith("gpt") and h == {"read_only"} for m, h in habits.items())
    assert any(h == {"none"} for h in habits.values())
    rates = [r["cache_hit_rate"] for r in chaos_fleet.manifest["runs"].values()]
    assert None in rates and 0.0 in rates and any(r and 0 < r < 1 for r in rates)


def test_usage_estimates_scopes_and_billing(chaos_fleet: Fleet) -> None:
    events = chaos_fleet.events
    rows = [ev for ev in events if ev["type"] == "usage_recorded"]
    estimates = [ev["data"]["usage"] for ev in rows if ev["data"]["usage"].get("estimated")]
    assert {u["confidence"] for u in estimates} == {"medium", "low"}
    assert all("cost" not in u and "currency" not in u for u in estimates)
    scopes = Counter(ev["data"]["scope"] for ev in rows)
    assert scopes["provider_turn"] > 0 and scopes["run_total"] > 0
    for ev in rows:
        has_turn = "turn" in ev["data"] and "attempt" in ev["data"]
        assert has_turn == (ev["data"]["scope"] == "provider_turn")
    mismatch = [r["usage_mismatch"] for r in chaos_fleet.manifest["runs"].values()]
    assert True in mismatch and False in mismatch
    # An estimate later superseded by the provider's report for the same turn and attempt.
    seen: dict[tuple[str, int, int], list[bool]] = defaultdict(list)
    for ev in rows:
        d = ev["data"]
        if d["scope"] == "provider_turn":
            seen[(ev["runId"], d["turn"], d["attempt"])].append(bool(d["usage"].get("estimated")))
    assert any(flags[:2] == [True, False] for flags in seen.values())
    # Retries: attempt 2 after a failed attempt 1 of the same turn.
    turns = defaultdict(dict)
    for ev in events:
        if ev["type"] == "provider_turn_finished":
            turns[(ev["runId"], ev["data"]["turn"])][ev["data"]["attempt"]] = ev["data"]
    assert any(
        a.get(1, {}).get("stopReason") == "provider_error" and 2 in a for a in turns.values()
    )
    tenants = chaos_fleet.manifest["tenants"]
    assert len(tenants) >= 4
    currencies = {c for t in tenants.values() for c in t["billable"]["cost"]}
    assert currencies == {"USD", "EUR"}
    assert len({(ev["model"]["provider"]) for ev in events}) >= 4


def test_envelopes_carry_ownership_digests_and_parents(chaos_fleet: Fleet) -> None:
    digest = re.compile(r"^sha256:[0-9a-f]{64}$")
    assert all(digest.match(ev["bundleDigest"]) for ev in chaos_fleet.events)
    started = [ev for ev in chaos_fleet.events if ev["type"] == "agent_started"]
    assert all("maxTurns" in ev["data"]["limits"] for ev in started)
    m = chaos_fleet.manifest["runs"]
    children = [rid for rid, r in m.items() if r["parent_run_id"]]
    assert children and all(m[rid]["parent_run_id"] in m for rid in children)
    child_refs = {
        ev["data"]["childRunId"]
        for ev in chaos_fleet.events
        if ev["type"] in ("child_milestone", "child_failed")
    }
    assert child_refs <= set(children)
    failed = [ev["data"] for ev in chaos_fleet.events if ev["type"] == "child_failed"]
    assert all(set(d["breach"]) == {"limit", "maximum", "observed"} for d in failed)


def test_model_and_deterministic_turn_numbers_never_collide(chaos_fleet: Fleet) -> None:
    kinds: dict[tuple[str, int], set[str]] = defaultdict(set)
    for ev in chaos_fleet.events:
        if ev["type"] in ("provider_turn_finished", "deterministic_turn_finished"):
            kinds[(ev["runId"], ev["data"]["turn"])].add(ev["type"])
    assert all(len(k) == 1 for k in kinds.values())


def test_never_finishing_runs_are_clearly_stale_or_clearly_fresh(chaos_fleet: Fleet) -> None:
    m = chaos_fleet.manifest
    watermark = _ts(m["watermark"])
    open_runs = [r for r in m["runs"].values() if r["terminal_type"] is None]
    assert open_runs
    for run in open_runs:
        idle = (watermark - _ts(run["last_event_at"])).total_seconds()
        if run["status"] == "incomplete":
            assert idle >= 2 * 3600
        else:
            assert run["status"] in ("running", "suspended") and idle <= 5 * 60
    runs = _by_run(chaos_fleet.events)
    stale_suspended = [
        rid
        for rid, r in m["runs"].items()
        if r["status"] == "incomplete" and runs[rid][-1]["type"] == "run_suspended"
    ]
    assert stale_suspended


def test_chaos_records_have_the_promised_shapes(chaos_fleet: Fleet) -> None:
    notes = Counter(r.note.removesuffix(" (extra)") for r in chaos_fleet.records)
    for note in (
        "duplicate",
        "re-emission",
        "post_terminal",
        "conflicting_terminal",
        "truncated_json",
        "invalid_utf8",
        "not_an_object",
        "wrong_type",
        "priced_estimate",
        "oversized",
    ):
        assert notes[note] > 0, note
    m = chaos_fleet.manifest
    assert m["dlq"]["oversized"] == notes["oversized"]
    assert all(len(r.value) > 1_048_576 for r in chaos_fleet.records if r.kind == "oversized")
    assert m["quarantine"]["conflicting_terminal"] == notes["conflicting_terminal"]
    modes = {r.note.endswith("(extra)") for r in chaos_fleet.records if r.kind != "valid"}
    assert modes == {True, False}  # junk both replaces events and comes on top of them
    # Re-emissions keep (runId, seq) and content but change eventId.
    by_key = {
        (r.event["runId"], r.event["seq"]): r.event
        for r in chaos_fleet.records
        if r.note == "" and r.event is not None
    }
    for r in chaos_fleet.records:
        if r.note == "re-emission":
            original = by_key[(r.event["runId"], r.event["seq"])]
            assert r.event["eventId"] != original["eventId"]
            assert {**r.event, "eventId": ""} == {**original, "eventId": ""}


def test_reordering_never_moves_events_across_the_terminal(chaos_fleet: Fleet) -> None:
    terminal_seq = {}
    for rid, run in _by_run(chaos_fleet.events).items():
        seqs = [e["seq"] for e in run if e["type"] in TERMINALS]
        if seqs:
            terminal_seq[rid] = min(seqs)
    reached: set[str] = set()
    reordered = 0
    last: dict[str, int] = {}
    for r in chaos_fleet.records:
        if r.kind != "valid" or r.note in ("duplicate", "re-emission"):
            continue
        ev = r.event
        rid, seq = ev["runId"], ev["seq"]
        if rid in terminal_seq:
            if seq > terminal_seq[rid]:
                assert rid in reached, "post-terminal noise delivered before the terminal"
            if seq == terminal_seq[rid]:
                reached.add(rid)
        reordered += seq < last.get(rid, -1)
        last[rid] = max(seq, last.get(rid, -1))
    assert reordered > 0


def test_jsonl_has_one_line_per_record(chaos_fleet: Fleet, tmp_path) -> None:
    path = tmp_path / "fleet.jsonl"
    assert write_jsonl(chaos_fleet, path) == len(chaos_fleet.records)
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b""
    assert lines[:-1] == [r.value for r in chaos_fleet.records]
    manifest = tmp_path / "manifest.json"
    write_manifest(chaos_fleet, manifest)
    import json

    assert json.loads(manifest.read_text()) == json.loads(json.dumps(chaos_fleet.manifest))


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        (dict(runs=0), "runs=0"),
        (dict(duplicates=1.5), "duplicates=1.5"),
        (dict(reorder_window=-1), "reorder_window=-1"),
        (dict(start=datetime(2026, 1, 1)), "no UTC offset"),
        (dict(clock="sundial"), "clock='sundial'"),
        (dict(max_event_bytes=10), "max_event_bytes=10"),
    ],
)
def test_bad_config_is_rejected_with_the_value(kwargs: dict[str, Any], needle: str) -> None:
    with pytest.raises(SimulatorConfigError, match=re.escape(needle)):
        FleetConfig(**kwargs)
    assert issubclass(SimulatorConfigError, SimulatorError)
    assert issubclass(SimulatorError, ValueError)
