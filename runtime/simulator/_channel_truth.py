"""Ground truth of channel-operation records (``prism.channel-operation/v1``), order-independent.

Over the SET of distinct records (an ``eventId`` seen again changes nothing):

- Records with an ``operationId`` form operations. Per ``seq`` the holder is the record with
  the smallest ``eventId`` (others: ``duplicate_seq``). Holders are applied in ``seq``
  order: a state that is not a legal successor of the operation's current state (the table
  below; the first record starts from "no state") is ``illegal_transition`` and changes
  nothing. The final state is the last accepted one.
- A denial without ``operationId`` stands alone (final state ``denied``).
- Open items: operations whose final state is ``delivery_unknown`` or
  ``execution_unknown`` (``since``: the ts of the record that entered it; ``age_seconds``
  at the watermark). Stuck: final state ``executing`` entered before the watermark minus
  the stuck threshold.

The transition table is written out here, apart from ``schemas``, so the manifest checks
the pipeline against the contract text rather than against shared code.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from ._builder import format_ts
from ._truth import ts_ms

__all__ = ["channel_truth"]

_LEGAL: dict[str | None, frozenset[str]] = {
    None: frozenset({"admitted", "denied", "duplicate"}),
    "admitted": frozenset({"executing"}),
    "executing": frozenset(
        {"delivered", "notice_delivered", "delivery_unknown", "execution_unknown", "cancelled"}
    ),
    "delivery_unknown": frozenset({"reconciled"}),
    "execution_unknown": frozenset({"reconciled"}),
}
_OPEN = ("delivery_unknown", "execution_unknown")
STATES = (
    "admitted",
    "executing",
    "delivered",
    "notice_delivered",
    "delivery_unknown",
    "execution_unknown",
    "cancelled",
    "reconciled",
    "denied",
    "duplicate",
)


def channel_truth(
    records: list[dict[str, Any]], duplicates: int, watermark_ms: int, stuck_ms: int
) -> dict[str, Any]:
    """The manifest's ``channels`` section from the distinct valid channel records."""
    quarantined: dict[str, str] = {}
    by_op: dict[str, list[dict[str, Any]]] = defaultdict(list)
    denials: list[dict[str, Any]] = []
    for rec in records:
        if rec.get("operationId") is None:
            denials.append(rec)
        else:
            by_op[rec["operationId"]].append(rec)
    operations: dict[str, dict[str, Any]] = {}
    for op_id, recs in sorted(by_op.items()):
        operations[op_id] = _operation(recs, quarantined, watermark_ms, stuck_ms)
    by_state: Counter[str] = Counter(op["state"] for op in operations.values() if op["state"])
    by_state["denied"] += len(denials)
    all_denials = denials + [
        rec for recs in by_op.values() for rec in recs
        if rec["state"] == "denied" and rec["eventId"] not in quarantined
    ]  # fmt: skip
    by_reason: Counter[str] = Counter(rec.get("reason") or "" for rec in all_denials)
    by_connection: dict[str, Counter[str]] = defaultdict(Counter)
    for rec in all_denials:
        by_connection[rec["connectionId"]][rec.get("reason") or ""] += 1
    open_items = [
        {
            "operation_id": op_id,
            "connection_id": op["connection_id"],
            "tenant_id": op["tenant_id"],
            "state": op["state"],
            "since": op["since"],
            "age_seconds": op["age_seconds"],
        }
        for op_id, op in operations.items()
        if op["state"] in _OPEN
    ]
    reasons = Counter(quarantined.values())
    return {
        "counts": {
            "records": len(records) + duplicates,
            "duplicates": duplicates,
            "unique_records": len(records),
            "operations": len(operations),
            "denials": len(all_denials),
        },
        "operations_by_state": {s: by_state.get(s, 0) for s in STATES},
        "open_items": open_items,
        "stuck": sorted(op_id for op_id, op in operations.items() if op["stuck"]),
        "denials": {
            "by_reason": dict(sorted(by_reason.items())),
            "by_connection": {
                conn: dict(sorted(c.items())) for conn, c in sorted(by_connection.items())
            },
        },
        "quarantine": {r: reasons.get(r, 0) for r in ("illegal_transition", "duplicate_seq")},
        "quarantined_events": dict(sorted(quarantined.items())),
        "operations": operations,
    }


def _operation(
    recs: list[dict[str, Any]], quarantined: dict[str, str], watermark_ms: int, stuck_ms: int
) -> dict[str, Any]:
    ordered = sorted(recs, key=lambda r: (int(r["seq"]), r["eventId"]))
    state: str | None = None
    entered_ms = 0
    accepted: list[dict[str, Any]] = []
    last_seq: int | None = None
    for rec in ordered:
        if rec["seq"] == last_seq:
            quarantined[rec["eventId"]] = "duplicate_seq"
            continue
        last_seq = rec["seq"]
        if rec["state"] not in _LEGAL.get(state, frozenset()):
            quarantined[rec["eventId"]] = "illegal_transition"
            continue
        state = rec["state"]
        entered_ms = ts_ms(rec)
        accepted.append(rec)
    first = accepted[0] if accepted else ordered[0]
    times = [ts_ms(r) for r in accepted] or [ts_ms(first)]
    return {
        "connection_id": first["connectionId"],
        "tenant_id": next((r["tenantId"] for r in accepted if r.get("tenantId")), None),
        "kind": first["kind"],
        "state": state,
        "reason": accepted[-1].get("reason") if accepted else None,
        "run_id": next((r["runId"] for r in accepted if r.get("runId")), None),
        "first_ts": format_ts(min(times)),
        "last_ts": format_ts(max(times)),
        "transitions": len(accepted),
        "since": format_ts(entered_ms),
        "age_seconds": round((watermark_ms - entered_ms) / 1000, 3),
        "stuck": state == "executing" and entered_ms < watermark_ms - stuck_ms,
    }
