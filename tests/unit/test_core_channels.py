"""The channel-operation semantics of the core (schemas/CONTRACT.md, "Channel operations").

By hand: the state machine, out-of-order transitions, illegal ones, duplicates, stuck
operations, open items, denials, restarts and poison isolation. Searched by hypothesis:
the channel ledger is a function of the set of records (any order, duplication, batching,
partitioning, restarts) and equals the simulator's independent truth; every record ends in
exactly one of the ledger, quarantine or the DLQ.
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prism.pipeline.core import (
    CoreConfig,
    InRecord,
    Intake,
    Output,
    PermanentStoreError,
    store_isolating,
)
from prism.runtime.simulator._channel_truth import STATES, channel_truth
from prism.schemas import ChannelOperationRow
from tests.fixtures.final_ledger import FinalLedger, feed_stream
from tests.fixtures.runs import NOW, T0

CFG = CoreConfig(processing_grace=False, channel_stuck_s=300, tombstone_retention_s=30 * 86400)
SOURCE = "prism.channel-operations"


def rec(
    op: str | None, seq: int, state: str, minute: float = 0, eid: str | None = None, **extra: Any
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "schema": "prism.channel-operation/v1",
        "eventId": eid or f"{op}-{seq}-{state}",
        "seq": seq,
        "ts": (T0 + timedelta(minutes=minute)).isoformat(),
        "connectionId": extra.pop("connectionId", "telegram:main"),
        "kind": "message",
        "state": state,
        "tenantId": "acme",
        **extra,
    }
    if op is not None:
        out["operationId"] = op
    if state == "denied":
        out.setdefault("reason", "capacity")
    return out


def feed(intake: Intake, ledger: FinalLedger, *batches: list[dict[str, Any]]) -> Output:
    """Each list is one batch on partition 0; returns the combined output."""
    total = Output()
    offset = sum(len(p.items) for p in intake.lane(0))  # any distinct offsets will do
    for batch in batches:
        records = []
        for r in batch:
            records.append(InRecord(orjson.dumps(r), SOURCE, 0, offset, b"k"))
            offset += 1
        total.extend(store_isolating(intake, {0: records}, NOW, ledger.add))
    return total


def op_row(ledger: FinalLedger, op: str) -> ChannelOperationRow:
    (row,) = [r for r in ledger.rows("channel_operations") if r.operation_id == op]
    return row  # type: ignore[no-any-return]


def test_a_delivered_operation_has_one_row_with_its_transitions_and_latency() -> None:
    intake, ledger = Intake(CFG), FinalLedger()
    feed(
        intake,
        ledger,
        [rec("op1", 0, "admitted", 0), rec("op1", 1, "executing", 0.1, runId="run-9")],
        [rec("op1", 2, "delivered", 0.5)],
    )
    row = op_row(ledger, "op1")
    assert (row.state, row.transitions, row.run_id, row.tenant_id) == (
        "delivered",
        3,
        "run-9",
        "acme",
    )
    assert row.delivered_at - row.admitted_at == timedelta(seconds=30)
    assert not row.stuck and ledger.rows("channel_quarantine") == []


def test_a_transition_before_its_predecessor_is_quarantined_then_applied() -> None:
    intake, ledger = Intake(CFG), FinalLedger()
    first = feed(intake, ledger, [rec("op1", 1, "executing", 1)])
    assert [r.reason for r in ledger.rows("channel_quarantine")] == ["illegal_transition"]
    assert op_row(ledger, "op1").state is None
    assert [dict(r.headers)["reason"] for r in first.quarantined] == [b"illegal_transition"]
    feed(intake, ledger, [rec("op1", 0, "admitted", 0)])
    assert ledger.rows("channel_quarantine") == []  # retracted: it counts now
    row = op_row(ledger, "op1")
    assert (row.state, row.transitions) == ("executing", 2)


def test_an_illegal_transition_is_quarantined_and_changes_nothing() -> None:
    intake, ledger = Intake(CFG), FinalLedger()
    path = [rec("op1", 0, "admitted"), rec("op1", 1, "executing"), rec("op1", 2, "delivered", 1)]
    out = feed(intake, ledger, path, [rec("op1", 3, "executing", 2)])
    (q,) = ledger.rows("channel_quarantine")
    assert (q.reason, q.state, q.seq, q.offset) == ("illegal_transition", "executing", 3, 3)
    assert (op_row(ledger, "op1").state, op_row(ledger, "op1").transitions) == ("delivered", 3)
    assert out.stats["quarantine.illegal_transition"] == 1


def test_duplicates_change_nothing_and_a_seq_is_held_by_the_smallest_event_id() -> None:
    intake, ledger = Intake(CFG), FinalLedger()
    a = rec("op1", 0, "admitted", eid="b-event")
    out = feed(intake, ledger, [a, a], [a])
    assert out.stats["duplicate"] == 2
    rows_before = dict(ledger.tables["channel_operations"])
    out = feed(intake, ledger, [rec("op1", 0, "denied", eid="a-event")])
    # "a-event" < "b-event": it holds seq 0 (a denial), and the admission becomes the duplicate
    assert op_row(ledger, "op1").state == "denied"
    assert {r.event_id: r.reason for r in ledger.rows("channel_quarantine")} == {
        "b-event": "duplicate_seq"
    }
    assert op_row(ledger, "op1").version > rows_before[("op1",)].version


def test_an_operation_executing_past_the_stuck_time_is_flagged_then_cleared() -> None:
    intake, ledger = Intake(CFG), FinalLedger()
    feed(intake, ledger, [rec("op1", 0, "admitted", 0), rec("op1", 1, "executing", 0)])
    feed(intake, ledger, [rec("op2", 0, "admitted", 4.9)])  # watermark: 4.9 min, not stuck
    assert not op_row(ledger, "op1").stuck
    feed(intake, ledger, [rec("op2", 1, "executing", 5.1)])  # 5.1 min > 300 s
    stuck = op_row(ledger, "op1")
    assert stuck.stuck and stuck.state == "executing"
    feed(intake, ledger, [rec("op1", 2, "delivered", 6)])
    done = op_row(ledger, "op1")
    assert not done.stuck and done.version > stuck.version


def test_open_items_last_until_reconciled() -> None:
    intake, ledger = Intake(CFG), FinalLedger()
    start = [rec("op1", 0, "admitted"), rec("op1", 1, "executing")]
    feed(intake, ledger, [*start, rec("op1", 2, "delivery_unknown", 1, reason="send timed out")])
    row = op_row(ledger, "op1")
    assert (row.state, row.reason, row.since) == (
        "delivery_unknown",
        "send timed out",
        T0 + timedelta(minutes=1),
    )
    feed(intake, ledger, [rec("op1", 3, "reconciled", 9, reason="resent")])
    assert (op_row(ledger, "op1").state, op_row(ledger, "op1").reason) == ("reconciled", "resent")
    (wm,) = ledger.rows("channel_watermarks")
    assert wm.watermark == T0 + timedelta(minutes=9)


def test_denials_without_an_operation_are_counted_once_and_write_no_operation() -> None:
    intake, ledger = Intake(CFG), FinalLedger()
    deny = rec(None, 0, "denied", 1, eid="d1", reason="capacity")
    other = rec(None, 0, "denied", 1.5, eid="d2", reason="unauthorized", connectionId="signal:x")
    feed(intake, ledger, [deny, other], [deny])
    assert ledger.rows("channel_operations") == []
    got = Counter((r.connection_id, r.reason) for r in ledger.rows("channel_denials"))
    assert got == {("telegram:main", "capacity"): 1, ("signal:x", "unauthorized"): 1}


def test_state_survives_a_restart_from_the_state_writes() -> None:
    intake, ledger = Intake(CFG), FinalLedger()
    state: dict[str, bytes] = {}
    out = feed(intake, ledger, [rec("op1", 0, "admitted"), rec(None, 0, "denied", eid="d1")])
    state.update({k: v for k, v in out.state_writes.items() if v is not None})
    assert any(k.startswith("c\x1f0\x1f") for k in state) and "cm\x1f0" in state
    again = Intake(CFG)
    again.load(0, state.items())
    assert set(again.channels) == {0}
    out = feed(again, ledger, [rec("op1", 0, "admitted"), rec(None, 0, "denied", eid="d1")])
    assert out.stats["duplicate"] == 2 and not out.ledger.channel_operations
    feed(again, ledger, [rec("op1", 1, "executing", 1)])
    assert op_row(ledger, "op1").transitions == 2


def test_a_record_the_ledger_refuses_is_dead_lettered_and_the_rest_is_stored() -> None:
    intake, ledger = Intake(CFG), FinalLedger()
    poison = rec("op2", 0, "admitted", eid="poison")

    def store(out: Output) -> None:
        if any(r.event_id == "poison" for r in out.ledger.channel_denials) or any(
            r.operation_id == "op2" for r in out.ledger.channel_operations
        ):
            raise PermanentStoreError("refused")
        ledger.add(out)

    records = [
        InRecord(orjson.dumps(r), SOURCE, 0, i)
        for i, r in enumerate([rec("op1", 0, "admitted"), poison, rec("op1", 1, "executing")])
    ]
    out = store_isolating(intake, {0: records}, NOW, store)
    assert [(d.offset, d.code) for d in out.ledger.dead_letters] == [(1, "unstorable")]
    assert op_row(ledger, "op1").transitions == 2
    assert "op2" not in intake.channels[0].operations  # its step was undone
    assert intake.next_offset(0) == 3


def test_one_file_lane_takes_both_families() -> None:
    from tests.fixtures.runs import RunBuilder

    intake, ledger = Intake(CFG), FinalLedger()
    run = RunBuilder("run-1").started().add("agent_finished")
    values = [*(orjson.dumps(e) for e in run.events), orjson.dumps(rec("op1", 0, "admitted"))]
    values.append(b"{not json")
    records = [InRecord(v, "file:mixed.jsonl", -1, n) for n, v in enumerate(values, 1)]
    store_isolating(intake, {-1: records}, NOW, ledger.add)
    ledger.add(intake.finalize(NOW))
    assert [r.status for r in ledger.rows("runs")] == ["succeeded"]
    assert op_row(ledger, "op1").state == "admitted"
    assert [d.offset for d in ledger.rows("dead_letters")] == [4]


# -- properties ---------------------------------------------------------------------------
@st.composite
def channel_sets(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A few operations with random seqs, states, ids and times, and standalone denials."""
    records: list[dict[str, Any]] = []
    for o in range(draw(st.integers(1, 4))):
        for _ in range(draw(st.integers(1, 5))):
            seq = draw(st.integers(0, 4))
            state = draw(st.sampled_from(STATES))
            minute = seq * 2 + draw(st.integers(0, 5))
            eid = f"e{o}-{seq}-{draw(st.integers(0, 2))}"
            r = rec(f"op{o}", seq, state, minute, eid=eid)
            if draw(st.booleans()):
                r.pop("tenantId")
            records.append(r)
    for d in range(draw(st.integers(0, 2))):
        records.append(rec(None, 0, "denied", draw(st.integers(0, 20)), eid=f"d{d}"))
    seen: dict[str, dict[str, Any]] = {}
    for r in records:  # one record per event id
        seen.setdefault(r["eventId"], r)
    return list(seen.values())


def _key(value: bytes, partitions: int) -> int:
    try:
        r = orjson.loads(value)
        key = r.get("operationId") or r.get("connectionId")
    except (orjson.JSONDecodeError, AttributeError):
        key = None
    return zlib.crc32(str(key).encode()) % partitions


def deliver(
    values: Sequence[bytes], partitions: int, sizes: Sequence[int], restarts: Sequence[int]
) -> tuple[FinalLedger, list[InRecord]]:
    """Feed as a worker would (keyed partitions, batches, restarts from saved state)."""
    return feed_stream(
        values,
        config=CFG,
        source=SOURCE,
        partition_of=_key,
        now=NOW,
        partitions=partitions,
        batch_sizes=sizes,
        invocations=restarts,
    )


def _channel_view(ledger: FinalLedger) -> dict[str, Any]:
    def plain(rows: list[Any], *drop: str) -> list[tuple[Any, ...]]:
        gone = {"version", "source", "partition", "offset", "received_at", *drop}
        return sorted(
            tuple((k, repr(v)) for k, v in vars_of(r).items() if k not in gone) for r in rows
        )

    return {
        name: plain(ledger.rows(name))
        for name in ("channel_operations", "channel_denials", "channel_quarantine")
    } | {"watermark": plain(ledger.rows("channel_watermarks"))}


def vars_of(row: Any) -> dict[str, Any]:
    return {f: getattr(row, f) for f in row.__dataclass_fields__}


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), records=channel_sets())
def test_the_channel_ledger_is_a_function_of_the_set_and_equals_the_truth(
    data: st.DataObject, records: list[dict[str, Any]]
) -> None:
    values = [orjson.dumps(r) for r in records]
    baseline, _ = deliver(values, 1, [10**6], [])
    shuffled = list(data.draw(st.permutations(values)))
    for _ in range(data.draw(st.integers(0, 3))):
        shuffled.insert(
            data.draw(st.integers(0, len(shuffled))), data.draw(st.sampled_from(values))
        )
    junk = data.draw(st.integers(0, 2))
    shuffled += [b'{"schema": "prism.channel-operation/v1", "seq": -1}'] * junk
    ledger, fed = deliver(
        shuffled,
        data.draw(st.integers(1, 3)),
        data.draw(st.lists(st.integers(1, 6), min_size=1, max_size=3)),
        data.draw(st.lists(st.integers(0, len(shuffled)), max_size=2)),
    )
    assert _channel_view(ledger) == _channel_view(baseline)
    # the simulator's truth, written apart from the core, agrees figure by figure
    wm = max(_ms(r["ts"]) for r in records)
    truth = channel_truth(records, 0, wm, 300_000)
    ops = {r.operation_id: r for r in ledger.rows("channel_operations")}
    assert set(ops) == set(truth["operations"])
    for op_id, want in truth["operations"].items():
        row = ops[op_id]
        got = (row.state, row.transitions, row.stuck, row.reason, row.tenant_id, row.kind)
        assert got == (want["state"], want["transitions"], want["stuck"], want["reason"],
                       want["tenant_id"], want["kind"])  # fmt: skip
    quarantined = {r.event_id: r.reason for r in ledger.rows("channel_quarantine")}
    assert quarantined == truth["quarantined_events"]
    denials = Counter(r.reason for r in ledger.rows("channel_denials"))
    assert dict(denials) == truth["denials"]["by_reason"]
    # every record fed ends in exactly one place: a transition, a standalone denial,
    # quarantine, the DLQ, or it re-delivers one of those
    standalone = sum(1 for r in ledger.rows("channel_denials") if r.operation_id is None)
    placed = sum(r.transitions for r in ops.values()) + standalone + len(quarantined)
    assert placed == len(records)
    dead = {(d.partition, d.offset) for d in ledger.rows("dead_letters")}
    assert len(dead) == junk == len(fed) - len(shuffled) + junk
    assert len(fed) == len(shuffled)


def _ms(ts: str) -> int:
    from datetime import datetime

    return int(datetime.fromisoformat(ts).timestamp() * 1000)


@pytest.mark.parametrize("state", ["delivered", "reconciled", "cancelled"])
def test_finished_operations_are_forgotten_after_the_retention(state: str) -> None:
    cfg = CoreConfig(processing_grace=False, tombstone_retention_s=3600)
    intake, ledger = Intake(cfg), FinalLedger()
    path = ["admitted", "executing", "delivery_unknown" if state == "reconciled" else state]
    path += ["reconciled"] if state == "reconciled" else []
    feed(intake, ledger, [rec("op1", i, s, i) for i, s in enumerate(path)])
    out = feed(intake, ledger, [rec("op2", 0, "admitted", 200)])
    assert "op1" not in intake.channels[0].operations
    assert out.state_writes["c\x1f0\x1fop1"] is None
