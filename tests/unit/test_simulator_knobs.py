"""The hostile, limit-death-burst and guardrail knobs on generated fleets: what they inject is
what the independently computed manifest concludes, deterministically per seed."""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from prism.runtime.simulator import (
    HOSTILE_KINDS,
    Fleet,
    FleetConfig,
    SimulatorConfigError,
    partition_of,
    simulate,
)
from prism.runtime.simulator._builder import format_ts
from prism.runtime.simulator._hostile import SKEW_BASE_MS
from prism.runtime.simulator._manifest import compute_manifest
from prism.schemas import EVENT_JSON_SCHEMA_PATH, ContractViolation, parse_batch

TERMINALS = {"agent_finished", "agent_denied", "error"}


@pytest.fixture(scope="module")
def hostile() -> Fleet:
    return simulate(FleetConfig(runs=250, seed=17, hostile=0.04, duplicates=0.01))


def _kind_runs(fleet: Fleet, kind: str) -> list[str]:
    return [r for r, k in fleet.manifest["injected"]["hostile_runs"].items() if k == kind]


def _events_of(fleet: Fleet, run_id: str) -> list[dict[str, Any]]:
    return [ev for ev in fleet.events if ev["runId"] == run_id]


def test_knobs_left_off_keep_the_fleet_byte_identical() -> None:
    fleet = simulate(
        FleetConfig(runs=300, seed=11, duplicates=0.03, reorder_window=3, post_terminal=0.05,
                    conflicting_terminals=0.05, malformed=0.03, oversized=0.01)
    )  # fmt: skip
    digest = hashlib.sha256(
        b"".join(r.key + r.value + r.kind.encode() + r.note.encode() for r in fleet.records)
    ).hexdigest()
    # The records this seed gave before the hostile, burst, guardrail and channel knobs.
    assert digest[:16] == "0639cedb6d8f2e2a"


def test_every_hostile_kind_happens_and_the_fleet_is_deterministic(hostile: Fleet) -> None:
    assert set(hostile.manifest["injected"]["hostile_runs"].values()) == set(HOSTILE_KINDS)
    again = simulate(hostile.config)
    assert [r.value for r in again.records] == [r.value for r in hostile.records]
    assert again.manifest == hostile.manifest
    other = simulate(FleetConfig(runs=250, seed=18, hostile=0.04, duplicates=0.01))
    assert [r.value for r in other.records] != [r.value for r in hostile.records]


def test_post_terminal_usage_delivered_before_the_terminal_is_quarantined(hostile: Fleet) -> None:
    q = hostile.manifest["quarantined_events"]
    for run_id in _kind_runs(hostile, "reorder_terminal"):
        order = [r.event for r in hostile.records if r.event and r.event["runId"] == run_id]
        (late,) = [r.event for r in hostile.records if r.note == "reorder_terminal"
                   and r.event and r.event["runId"] == run_id]  # fmt: skip
        terminal = next(ev for ev in order if ev["type"] in TERMINALS)
        assert late["seq"] > terminal["seq"]
        assert order.index(late) < order.index(terminal)  # delivered first
        assert q[late["eventId"]] == "post_terminal"


def test_late_tenant_runs_belong_to_the_tenant_named_later(hostile: Fleet) -> None:
    for run_id in _kind_runs(hostile, "late_tenant"):
        events = sorted(_events_of(hostile, run_id), key=lambda e: e["seq"])
        assert "tenantId" not in events[0]
        named = next(ev["tenantId"] for ev in events if "tenantId" in ev)
        assert hostile.manifest["runs"][run_id]["tenant_id"] == named
    assert "" not in hostile.manifest["tenants"]


def test_skewed_producers_are_flagged_and_cannot_move_the_watermark(hostile: Fleet) -> None:
    m = hostile.manifest
    skewed = _kind_runs(hostile, "clock_skew")
    assert skewed and {r for r, row in m["runs"].items() if row["clock_skew"]} == set(skewed)
    clock = datetime.fromisoformat(m["params"]["processing_clock"])
    assert datetime.fromisoformat(m["watermark"]) <= clock + timedelta(seconds=300)
    assert m["watermark"] < "2100"  # the skewed stamps moved nothing
    assert any(ev["ts"].startswith("2199-") for r in skewed for ev in _events_of(hostile, r))
    assert format_ts(SKEW_BASE_MS).startswith("2199-06-01T00:00:00")


def test_a_colliding_tenant_changes_nothing_in_the_owners_run(hostile: Fleet) -> None:
    q = hostile.manifest["quarantined_events"]
    for run_id in _kind_runs(hostile, "run_id_collision"):
        intruders = [r.event for r in hostile.records
                     if r.note == "run_id_collision" and r.event]  # fmt: skip
        mine = [ev for ev in intruders if ev["runId"] == run_id]
        assert mine and {q[ev["eventId"]] for ev in mine} == {"tenant_mismatch"}
        owner = hostile.manifest["runs"][run_id]["tenant_id"]
        assert owner not in {ev["tenantId"] for ev in mine}
        own = sorted(
            (ev for ev in _events_of(hostile, run_id) if ev.get("tenantId") == owner),
            key=lambda ev: ev["seq"],
        )
        terminal = next(ev["type"] for ev in own if ev["type"] in TERMINALS)
        assert hostile.manifest["runs"][run_id]["terminal_type"] == terminal
        assert hostile.manifest["runs"][run_id]["model_turns"] == len(
            {ev["data"]["turn"] for ev in own if ev["type"] == "provider_turn_finished"}
        )


def test_a_second_report_of_one_turn_is_never_billed(hostile: Fleet) -> None:
    q = hostile.manifest["quarantined_events"]
    copies = [r.event for r in hostile.records if r.note == "duplicate_usage" and r.event]
    assert copies
    for ev in copies:
        assert q[ev["eventId"]] == "duplicate_usage"
        originals = [
            o for o in _events_of(hostile, ev["runId"])
            if o["type"] == "usage_recorded" and o["eventId"] != ev["eventId"]
            and (o["data"].get("turn"), o["data"].get("attempt"))
            == (ev["data"]["turn"], ev["data"]["attempt"])
        ]  # fmt: skip
        assert originals and all(o["eventId"] not in q for o in originals)


def test_the_quiet_partition_holds_only_runs_that_go_stale(hostile: Fleet) -> None:
    m = hostile.manifest
    quiet = m["injected"]["quiet_partition"]
    assert quiet == hostile.config.partitions - 1
    on_quiet = {rid for rid in m["runs"] if partition_of(rid, hostile.config.partitions) == quiet}
    assert on_quiet == set(_kind_runs(hostile, "quiet_partition"))
    assert {m["runs"][rid]["status"] for rid in on_quiet} == {"incomplete"}
    last_quiet = max(r.ts_ms for r in hostile.records if r.key.decode() in on_quiet)
    assert last_quiet < max(r.ts_ms for r in hostile.records) - 3_600_000


def test_hostile_events_are_all_valid_contract_events(hostile: Fleet) -> None:
    schema = json.loads(EVENT_JSON_SCHEMA_PATH.read_text(encoding="utf-8"))
    validator = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
    noted = [r.event for r in hostile.records if r.note in HOSTILE_KINDS and r.event]
    assert len(noted) > 20
    for ev in noted + hostile.events[::25]:  # every hostile event, a sample of the others
        assert list(validator.iter_errors(ev)) == [], ev["eventId"]
    values = [r.value for r in hostile.records if r.kind == "valid"]
    assert not [r for r in parse_batch(values) if isinstance(r, ContractViolation)]


def test_a_limit_death_burst_fires_the_exhaustion_alert() -> None:
    fleet = simulate(FleetConfig(runs=60, seed=2, limit_death_burst=6))
    m = fleet.manifest
    burst = set(m["injected"]["burst_runs"])
    assert len(burst) == 6 and len(m["runs"]) == 60
    alerts = [a for a in m["alerts"]["run_limit_exhaustion"] if set(a["run_ids"]) <= burst]
    (alert,) = alerts
    assert (alert["tenant_id"], alert["key"], alert["count"]) == ("acme-corp", "maxTurns", 5)
    for run_id in burst:
        row = m["runs"][run_id]
        assert (row["status"], row["exhaustion"]["axis"]) == ("failed", "maxTurns")
    below = simulate(FleetConfig(runs=60, seed=2, limit_death_burst=4))
    burst = set(below.manifest["injected"]["burst_runs"])
    assert not [a for a in below.manifest["alerts"]["run_limit_exhaustion"]
                if set(a["run_ids"]) & burst]  # fmt: skip


def test_guardrail_denials_are_counted_by_pack_and_rule() -> None:
    fleet = simulate(FleetConfig(runs=150, seed=4, guardrail_denials=0.2))
    g = fleet.manifest["guardrails"]
    denials = [ev for ev in fleet.events if ev["type"] == "guardrail_denied"]
    assert g["denials"] == len(denials) > 5
    assert sum(g["by_rule"].values()) == sum(g["by_pack"].values()) == g["denials"]
    assert all(re.fullmatch(r"pack:[a-z-]+/[a-z-]+", rule) for rule in g["by_rule"])
    per_run: dict[str, int] = defaultdict(int)
    for ev in denials:
        per_run[ev["runId"]] += 1
        assert ev["data"]["stage"] in ("before_tool", "after_tool", "output")
    for run_id, n in per_run.items():
        assert fleet.manifest["runs"][run_id]["guardrail_denials"] == n
    assert not any(isinstance(r, ContractViolation) for r in parse_batch(
        [r.value for r in fleet.records]))  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"hostile": 1.5}, "hostile=1.5 is not a probability"),
        ({"hostile": 0.1, "partitions": 1}, "needs partitions >= 2"),
        ({"limit_death_burst": 11, "runs": 10}, "limit_death_burst=11 is out of range"),
        ({"channel_operations": -1}, "channel_operations=-1 is out of range"),
        ({"alert_threshold": 0}, "alert_threshold=0 is out of range"),
        ({"max_clock_skew_seconds": float("inf")}, "max_clock_skew_seconds=inf is out of range"),
        ({"processing_clock": datetime(2026, 1, 1)}, "has no UTC offset"),
    ],
)
def test_bad_knobs_are_rejected_with_the_value(kwargs: dict[str, Any], needle: str) -> None:
    with pytest.raises(SimulatorConfigError, match=re.escape(needle)):
        FleetConfig(**kwargs)


ALL_KNOBS = dict(
    duplicates=0.03,
    reorder_window=3,
    post_terminal=0.05,
    conflicting_terminals=0.05,
    malformed=0.03,
    oversized=0.01,
    hostile=0.05,
    guardrail_denials=0.1,
    limit_death_burst=5,
    channel_operations=150,
)


@pytest.mark.parametrize(
    "knobs",
    [{name: value} for name, value in ALL_KNOBS.items() if name in (
        "hostile", "guardrail_denials", "limit_death_burst", "channel_operations")] + [ALL_KNOBS],
    ids=lambda k: "all" if len(k) > 1 else next(iter(k)),
)  # fmt: skip
def test_each_knob_is_deterministic_per_seed_and_emits_only_valid_events(
    knobs: dict[str, Any],
) -> None:
    config = FleetConfig(runs=120, seed=31, **knobs)
    fleet, again = simulate(config), simulate(config)
    assert [(r.key, r.value, r.note) for r in again.records] == [
        (r.key, r.value, r.note) for r in fleet.records
    ]
    assert again.manifest == fleet.manifest
    schema = json.loads(EVENT_JSON_SCHEMA_PATH.read_text(encoding="utf-8"))
    validator = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
    special = [ev for ev in fleet.events if ev["type"] == "guardrail_denied"]
    for ev in special + fleet.events[::40]:
        assert list(validator.iter_errors(ev)) == [], ev["eventId"]


def test_the_manifest_is_a_function_of_the_set_of_records() -> None:
    fleet = simulate(FleetConfig(runs=220, seed=9, **ALL_KNOBS))
    shuffled = list(fleet.records)
    random.Random(1).shuffle(shuffled)
    again = compute_manifest(shuffled, fleet.config, fleet.manifest["injected"])
    assert again == fleet.manifest
    m = fleet.manifest
    assert all(m["quarantine"].values())  # every rule had something to judge
    assert m["channels"]["quarantine"]["illegal_transition"] > 0
    assert m["alerts"]["run_limit_exhaustion"] and m["guardrails"]["denials"] > 0
