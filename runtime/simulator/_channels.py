"""Messaging-channel traffic: ``prism.channel-operation/v1`` records with the seeds' failure modes.

Each admission attempt becomes an operation (``admitted`` -> ``executing`` -> an outcome)
or a standalone record: a denial (no operation id; ``capacity`` among the reasons, plus a
burst of capacity denials on one connection) or a transport ``duplicate``. Failure modes
from the messaging-channels seed: the send threw (``delivery_unknown``, reconciled later or
left open), the process died while claimed (``execution_unknown`` filed by a later
reconcile, or still ``executing``: stuck), cancellations and bounded notices. Chaos on
top: records re-sent by the transport (same ``eventId``), an operation's records delivered
out of ``seq`` order, and an illegal transition appended to some finished operations.
"""

from __future__ import annotations

import random
from typing import Any

from ._builder import format_ts, hex_id, uuid7
from ._chaos import FleetRecord, dumps

__all__ = ["CONNECTIONS", "channel_records"]

CHANNEL_SCHEMA_ID = "prism.channel-operation/v1"
CONNECTIONS: tuple[tuple[str, str], ...] = (
    ("telegram:acme-support", "acme-corp"),
    ("signal:acme-oncall", "acme-corp"),
    ("telegram:globex-help", "globex"),
    ("telegram:initech-desk", "initech"),
    ("telegram:umbrella-eu", "umbrella-eu"),
    ("signal:hooli-ops", "hooli"),
)
_KINDS = (("message", 80), ("command", 10), ("approval", 5), ("notify", 5))
_OUTCOMES = (
    ("delivered", 58),
    ("notice_delivered", 8),
    ("delivery_unknown", 5),
    ("execution_unknown", 4),
    ("stuck", 2),
    ("running", 2),
    ("cancelled", 4),
    ("denied", 13),
    ("duplicate", 4),
)
_DENIALS = (
    ("unauthorized", 30),
    ("capacity", 20),
    ("awaiting_decision", 14),
    ("unsupported_media", 10),
    ("oversized", 8),
    ("malformed", 8),
    ("unavailable", 6),
)
# final state -> an illegal next state a confused producer sends
_ILLEGAL = {
    "delivered": ("executing", "reconciled", "delivered"),
    "notice_delivered": ("delivered",),
    "cancelled": ("delivered", "executing"),
    "reconciled": ("delivered", "reconciled"),
}
_HEADERS = (("content-type", b"application/json"),)
_MINUTE = 60_000


def _pick(rng: random.Random, table: tuple[tuple[str, int], ...]) -> str:
    return rng.choices([k for k, _ in table], [w for _, w in table])[0]


class _Op:
    """Records of one operation (or one standalone record), in seq order."""

    def __init__(
        self, rng: random.Random, connection: str, tenant: str, kind: str, op_id: str | None
    ) -> None:
        self.rng = rng
        self.connection = connection
        self.tenant = tenant
        self.kind = kind
        self.op_id = op_id
        self.records: list[tuple[int, dict[str, Any], str]] = []  # (ms, record, note)
        self.run: dict[str, Any] = {}

    def emit(self, ms: int, state: str, note: str = "", **extra: Any) -> None:
        record: dict[str, Any] = {
            "schema": CHANNEL_SCHEMA_ID,
            "eventId": uuid7(ms, self.rng.getrandbits(74)),
            "operationId": self.op_id,
            "seq": len(self.records),
            "ts": format_ts(ms),
            "connectionId": self.connection,
            "kind": self.kind,
            "state": state,
            **extra,
        }
        if state != "admitted":
            record.update(self.run)
        record["tenantId"] = self.tenant
        self.records.append((ms, {k: v for k, v in record.items() if v is not None}, note))


def channel_records(
    rng: random.Random,
    n: int,
    runs_by_tenant: dict[str, list[tuple[str, str]]],
    start: int,
    end: int,
    stuck_ms: int,
) -> list[list[FleetRecord]]:
    """``n`` admission attempts between ``start`` and ``end`` (epoch ms), one list per
    operation in delivery order. ``runs_by_tenant`` maps a tenant to (runId, agent id)
    pairs the operations may have run as."""
    burst = max(3, n // 25) if n >= 10 else 0
    forced = ["delivered", "notice_delivered", "delivery_unknown", "delivery_unknown"]
    forced += ["execution_unknown", "execution_unknown", "stuck", "running", "cancelled"]
    forced += ["denied", "duplicate"]
    outcomes = [
        forced[i] if i < len(forced) and n >= len(forced) + burst else _pick(rng, _OUTCOMES)
        for i in range(n - burst)
    ]
    ops = [_operation(rng, outcome, i, runs_by_tenant, start, end, stuck_ms) for i, outcome in
           enumerate(outcomes)]  # fmt: skip
    if burst:
        connection, tenant = rng.choice(CONNECTIONS)
        at = start + rng.randint(30 * _MINUTE, max(30 * _MINUTE, end - start - 30 * _MINUTE))
        denials = []
        for _ in range(burst):
            op = _Op(rng, connection, tenant, "message", None)
            at += rng.randint(200, 4_000)
            op.emit(at, "denied", "capacity_burst", reason="capacity")
            denials.append(op)
        # A large fleet's burst (n // 25 denials, ~2 s apart) outlasts the room left for
        # it: moved back whole, it still ends by the agents' watermark, as all channel
        # traffic does (a later one would move a live pipeline's watermark past the truth's).
        overflow = at - end
        for op in denials if overflow > 0 else ():
            ms, record, note = op.records[0]
            op.records[0] = (ms - overflow, {**record, "ts": format_ts(ms - overflow)}, note)
        ops += denials
    finished = [op for op in ops if op.records and op.records[-1][1]["state"] in _ILLEGAL]
    illegal = [op for op in finished if rng.random() < 0.03]
    if finished and not illegal:
        illegal = rng.sample(finished, min(2, len(finished)))
    for op in illegal:
        ms, last, _ = op.records[-1]
        state = rng.choice(_ILLEGAL[last["state"]])
        op.emit(min(end, ms + rng.randint(1_000, 10_000)), state, "illegal_transition")
    out = [_deliver(rng, op) for op in ops]
    _transport_duplicates(rng, out)
    return out


def _operation(
    rng: random.Random,
    outcome: str,
    i: int,
    runs_by_tenant: dict[str, list[tuple[str, str]]],
    start: int,
    end: int,
    stuck_ms: int,
) -> _Op:
    connection, tenant = CONNECTIONS[i % len(CONNECTIONS)] if i < 12 else rng.choice(CONNECTIONS)
    kind = _pick(rng, _KINDS)
    if outcome == "denied":
        op = _Op(rng, connection, tenant, kind, None)
        op.emit(rng.randint(start, end - _MINUTE), "denied", reason=_pick(rng, _DENIALS))
        return op
    op = _Op(rng, connection, tenant, kind, "op_" + hex_id(rng))
    if outcome == "duplicate":
        op.emit(rng.randint(start, end - _MINUTE), "duplicate", duplicate=True)
        return op
    runs = runs_by_tenant.get(tenant)
    if runs and kind != "notify":
        run_id, agent = rng.choice(runs)
        op.run = {"runId": run_id, "sessionId": "chan-" + hex_id(rng, 6), "agent": {"id": agent}}
    if outcome == "running":  # executing, recently: not stuck yet
        t = end - rng.randint(30_000, min(stuck_ms, 120_000))
    elif outcome in ("delivery_unknown", "execution_unknown"):
        t = rng.randint(start, end - 80 * _MINUTE)
    elif outcome == "stuck":
        t = rng.randint(start, end - stuck_ms - 2 * _MINUTE)
    else:
        t = rng.randint(start, end - 2 * _MINUTE)
    op.emit(t, "admitted")
    t += rng.randint(50, 2_000)
    op.emit(t, "executing")
    if outcome in ("running", "stuck"):
        return op
    if outcome == "delivered":
        op.emit(t + rng.randint(1_500, 45_000), "delivered")
    elif outcome == "notice_delivered":
        reason = rng.choice(("run failed", "run aborted", "run suspended"))
        op.emit(t + rng.randint(1_000, 30_000), "notice_delivered", reason=reason)
    elif outcome == "cancelled":
        reason = rng.choice(("user /cancel", "host stop"))
        op.emit(t + rng.randint(1_000, 20_000), "cancelled", reason=reason)
    elif outcome == "delivery_unknown":
        t += rng.randint(2_000, 60_000)
        op.emit(t, "delivery_unknown", reason="send timed out")
        if i % 2 == 0:  # half are reconciled by the host later, half stay open items
            later = t + rng.randint(5, 50) * _MINUTE
            op.emit(later, "reconciled", reason=rng.choice(("resent", "acknowledged")))
    else:  # execution_unknown: the process died; a reconcile files it later
        t += rng.randint(10, 40) * _MINUTE
        op.emit(t, "execution_unknown", reason="process died while claimed")
        if i % 2 == 1:
            op.emit(t + rng.randint(5, 30) * _MINUTE, "reconciled", reason="acknowledged")
    return op


def _deliver(rng: random.Random, op: _Op) -> list[FleetRecord]:
    key = (op.op_id or op.connection).encode()
    recs = [
        FleetRecord(key, dumps(rec), _HEADERS, "valid", ms, rec, note, "channel")
        for ms, rec, note in op.records
    ]
    if len(recs) >= 3 and rng.random() < 0.05:  # the last two arrive out of seq order
        a, b = recs[-2], recs[-1]
        recs[-2:] = [_with_note(b, "reordered"), a]
    return recs


def _with_note(rec: FleetRecord, note: str) -> FleetRecord:
    return FleetRecord(
        rec.key, rec.value, rec.headers, rec.kind, rec.ts_ms, rec.event, note, rec.family
    )


def _transport_duplicates(rng: random.Random, per_op: list[list[FleetRecord]]) -> None:
    """Re-send ~2% of records (same bytes, same eventId) right after the original; one at least."""
    chosen = [
        (i, j) for i, recs in enumerate(per_op) for j in range(len(recs)) if rng.random() < 0.02
    ]
    if not chosen and per_op:
        i = rng.randrange(len(per_op))
        chosen = [(i, rng.randrange(len(per_op[i])))]
    for i, j in sorted(chosen, reverse=True):
        per_op[i].insert(j + 1, _with_note(per_op[i][j], "transport_duplicate"))
