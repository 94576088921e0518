"""Channel-operation traffic: the manifest's truth by hand, and the generated failure modes."""

from __future__ import annotations

import json
import random
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

import orjson
import pytest
from jsonschema import Draft202012Validator

from prism.runtime.simulator import Fleet, FleetConfig, FleetRecord, simulate, write_jsonl
from prism.runtime.simulator._manifest import compute_manifest
from prism.schemas import (
    CHANNEL_JSON_SCHEMA_PATH,
    ChannelOperation,
    ContractViolation,
    parse_any_batch,
)
from tests.unit.test_simulator_manifest import T0, Runs


class Ops:
    """Hand-written channel records with explicit times (seconds after T0)."""

    def __init__(self, f: Runs) -> None:
        self.f = f
        self.n = 0

    def add(self, op: str | None, seq: int, state: str, at: float, **extra: Any) -> dict[str, Any]:
        self.n += 1
        rec: dict[str, Any] = {
            "schema": "prism.channel-operation/v1",
            "eventId": extra.pop("event_id", f"c{self.n:03d}"),
            "operationId": op,
            "seq": seq,
            "ts": (T0 + timedelta(seconds=at)).isoformat(),
            "connectionId": extra.pop("connection", "telegram:a"),
            "kind": "message",
            "state": state,
            "tenantId": "acme",
            **extra,
        }
        rec = {k: v for k, v in rec.items() if v is not None}
        self.resend(rec)
        return rec

    def resend(self, rec: dict[str, Any]) -> None:
        ms = int(datetime.fromisoformat(rec["ts"]).timestamp() * 1000)
        key = (rec.get("operationId") or rec["connectionId"]).encode()
        self.f.records.append(
            FleetRecord(key, orjson.dumps(rec), (), "valid", ms, rec, "", "channel")
        )


def test_channel_truth_by_hand() -> None:
    f = Runs()
    f.emit("run", 0, "agent_started", at=0)
    f.emit("run", 1, "agent_started", at=3600)  # the watermark: T0 + 1 h
    c = Ops(f)
    # op1 delivered, its records arriving out of seq order
    delivered = c.add("op1", 2, "delivered", 30)
    c.add("op1", 0, "admitted", 10)
    c.add("op1", 1, "executing", 11)
    # op2: the send threw -> an open item
    for seq, state, at in (
        (0, "admitted", 100),
        (1, "executing", 101),
        (2, "delivery_unknown", 150),
    ):
        c.add("op2", seq, state, at)
    # op3: the process died; a reconcile filed it and a host reconciled it
    for seq, state, at in (
        (0, "admitted", 200),
        (1, "executing", 201),
        (2, "execution_unknown", 900),
        (3, "reconciled", 1000),
    ):
        c.add("op3", seq, state, at, reason="acknowledged" if state == "reconciled" else None)
    # op4 executing for 10 minutes at the watermark: stuck; op5 for 1 minute: not yet
    c.add("op4", 0, "admitted", 2999)
    c.add("op4", 1, "executing", 3000)
    c.add("op5", 0, "admitted", 3539)
    c.add("op5", 1, "executing", 3540)
    # op6: executing again after delivered; op7: skips executing
    for seq, state, at in ((0, "admitted", 40), (1, "executing", 41), (2, "delivered", 42)):
        c.add("op6", seq, state, at)
    again = c.add("op6", 3, "executing", 43)
    c.add("op7", 0, "admitted", 50)
    skipped = c.add("op7", 1, "delivered", 51)
    # op8: two records claim seq 1; the smaller eventId holds it
    c.add("op8", 0, "admitted", 60)
    c.add("op8", 1, "executing", 61, event_id="z-exec")
    c.add("op8", 1, "executing", 61, event_id="a-exec")
    # standalone records: denials (one re-sent by the transport) and a duplicate admission
    d1 = c.add(None, 0, "denied", 70, reason="capacity")
    c.resend(d1)
    c.add(None, 0, "denied", 71, reason="capacity")
    c.add(None, 0, "denied", 72, reason="unauthorized", connection="signal:b")
    c.add("op9", 0, "duplicate", 80, duplicate=True)

    m = compute_manifest(f.records, FleetConfig(runs=1, channel_operations=1))
    ch = m["channels"]
    assert m["watermark"] == "2026-11-30T01:00:00.000+00:00"
    assert ch["counts"] == {
        "records": 28,
        "duplicates": 1,
        "unique_records": 27,
        "operations": 9,
        "denials": 3,
    }
    assert ch["operations_by_state"] == {
        "admitted": 1,
        "executing": 3,
        "delivered": 2,
        "notice_delivered": 0,
        "delivery_unknown": 1,
        "execution_unknown": 0,
        "cancelled": 0,
        "reconciled": 1,
        "denied": 3,
        "duplicate": 1,
    }
    assert ch["open_items"] == [
        {
            "operation_id": "op2",
            "connection_id": "telegram:a",
            "tenant_id": "acme",
            "state": "delivery_unknown",
            "since": "2026-11-30T00:02:30.000+00:00",
            "age_seconds": 3450.0,
        }
    ]
    assert ch["stuck"] == ["op4", "op8"]  # op5 has executed for only a minute
    assert ch["denials"] == {
        "by_reason": {"capacity": 2, "unauthorized": 1},
        "by_connection": {"signal:b": {"unauthorized": 1}, "telegram:a": {"capacity": 2}},
    }
    assert ch["quarantine"] == {"illegal_transition": 2, "duplicate_seq": 1}
    assert ch["quarantined_events"] == {
        again["eventId"]: "illegal_transition",
        skipped["eventId"]: "illegal_transition",
        "z-exec": "duplicate_seq",
    }
    op1 = ch["operations"]["op1"]
    assert (op1["state"], op1["transitions"], op1["first_ts"], op1["last_ts"]) == (
        "delivered",
        3,
        "2026-11-30T00:00:10.000+00:00",
        delivered["ts"].replace("+00:00", ".000+00:00"),
    )
    assert ch["operations"]["op3"]["reason"] == "acknowledged"
    # Only the set of records matters, not their order.
    rng = random.Random(3)
    for _ in range(10):
        rng.shuffle(f.records)
        again_m = compute_manifest(f.records, FleetConfig(runs=1, channel_operations=1))
        assert again_m["channels"] == ch


@pytest.fixture(scope="module")
def fleet() -> Fleet:
    return simulate(
        FleetConfig(runs=120, seed=8, channel_operations=400, duplicates=0.02, reorder_window=2)
    )


def test_channel_traffic_has_every_failure_mode(fleet: Fleet) -> None:
    ch = fleet.manifest["channels"]
    states = ch["operations_by_state"]
    for state in ("delivered", "notice_delivered", "delivery_unknown", "execution_unknown",
                  "cancelled", "reconciled", "denied", "duplicate", "executing"):  # fmt: skip
        assert states[state] > 0, state
    assert {item["state"] for item in ch["open_items"]} == {"delivery_unknown", "execution_unknown"}
    assert ch["stuck"] and ch["quarantine"]["illegal_transition"] >= 2
    assert ch["counts"]["duplicates"] >= 1
    assert ch["denials"]["by_reason"]["capacity"] >= 400 // 25
    by_connection = Counter()
    for reasons in ch["denials"]["by_connection"].values():
        by_connection.update(reasons)
    assert dict(by_connection) == ch["denials"]["by_reason"]
    notes = Counter(r.note for r in fleet.records if r.family == "channel")
    assert {"transport_duplicate", "illegal_transition", "capacity_burst"} <= set(notes)
    # A stuck operation is executing and was claimed more than 300 s before the watermark.
    watermark = datetime.fromisoformat(fleet.manifest["watermark"])
    for op_id in ch["stuck"]:
        op = ch["operations"][op_id]
        assert op["state"] == "executing"
        assert watermark - datetime.fromisoformat(op["since"]) > timedelta(seconds=300)


def test_channel_records_never_move_the_agent_watermark(fleet: Fleet) -> None:
    without = simulate(FleetConfig(runs=120, seed=8, duplicates=0.02, reorder_window=2))
    assert fleet.manifest["watermark"] == without.manifest["watermark"]
    assert fleet.manifest["runs"] == without.manifest["runs"]
    assert fleet.manifest["tenants"] == without.manifest["tenants"]
    assert [r for r in fleet.records if r.family == "agent"] == without.records


def test_every_channel_record_is_valid_and_keyed(fleet: Fleet) -> None:
    schema = json.loads(CHANNEL_JSON_SCHEMA_PATH.read_text(encoding="utf-8"))
    validator = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
    channel = [r for r in fleet.records if r.family == "channel"]
    assert len(channel) == len(fleet.channel_events) > 400
    for rec, parsed in zip(channel, parse_any_batch([r.value for r in channel]), strict=True):
        assert isinstance(parsed, ChannelOperation), getattr(parsed, "reason", parsed)
        assert rec.key == parsed.key.encode()
        assert list(validator.iter_errors(rec.event)) == []
    agent = parse_any_batch([r.value for r in fleet.records if r.family == "agent"])
    assert not any(isinstance(r, ContractViolation | ChannelOperation) for r in agent)


def test_channel_records_are_deterministic_and_written_to_jsonl(fleet: Fleet, tmp_path) -> None:
    again = simulate(fleet.config)
    assert [r.value for r in again.records] == [r.value for r in fleet.records]
    assert again.manifest == fleet.manifest
    path = tmp_path / "fleet.jsonl"
    assert write_jsonl(fleet, path) == len(fleet.records)
    schemas = Counter(orjson.loads(line)["schema"] for line in path.read_bytes().splitlines())
    assert schemas["prism.channel-operation/v1"] == len(fleet.channel_events)


def test_a_large_fleets_capacity_burst_still_ends_by_the_agents_watermark() -> None:
    """n // 25 denials about 2 s apart: 2,000 of them (70 minutes) outlast the room left
    for the burst. A denial stamped after the agents' watermark moved a live pipeline's watermark
    (its clock is the wall's) past the manifest's, whose clock is the fleet's: the open
    items' ages differed by 793 s in a 10-minute soak."""
    from prism.runtime.simulator._channels import channel_records

    start, end = 0, 85 * 60 * 1000  # the burst begins 30-55 minutes in
    runs = {"acme": [("run-1", "agent-1")]}
    ops = channel_records(random.Random(3), 50_000, runs, start, end, 300_000)
    burst = [r for op in ops for r in op if r.note == "capacity_burst"]
    assert len(burst) == 50_000 // 25
    times = [int(datetime.fromisoformat(orjson.loads(r.value)["ts"]).timestamp() * 1000)
             for op in ops for r in op]  # fmt: skip
    assert max(times) <= end
    burst_times = sorted(
        int(datetime.fromisoformat(orjson.loads(r.value)["ts"]).timestamp() * 1000) for r in burst
    )
    assert burst_times[-1] - burst_times[0] > 55 * 60 * 1000  # longer than the room left
