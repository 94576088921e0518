"""Ledger rows built from one applied event: the raw log row and the usage rows."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import orjson

from prism.schemas import RawEventRow, UsageRow

from ._run import RunState, from_us
from ._types import Delivery

__all__ = ["data_of", "raw_row", "usage_rows"]


def data_of(ev: Any) -> dict[str, Any]:
    """The event's payload in wire form (camelCase, absent fields omitted)."""
    data = ev.data
    if isinstance(data, dict):
        return data
    return data.model_dump(mode="json", by_alias=True, exclude_none=True)


def raw_row(d: Delivery, ev: Any, data: dict[str, Any]) -> RawEventRow:
    agent, model, parent = ev.agent, ev.model, ev.parent
    return RawEventRow(
        event_id=ev.event_id,
        run_id=ev.run_id,
        seq=ev.seq,
        type=ev.type,
        ts=ev.ts,
        tenant_id=ev.tenant_id,
        account_id=ev.account_id,
        user_id=ev.user_id,
        session_id=ev.session_id,
        agent_id=agent.id if agent is not None else None,
        provider=model.provider if model is not None else None,
        model=model.model if model is not None else None,
        parent_run_id=parent.run_id if parent is not None else None,
        bundle_digest=ev.bundle_digest,
        payload=orjson.dumps(data).decode(),
        traceparent=d.traceparent,
        source=d.source,
        partition=d.partition,
        offset=d.offset,
        received_at=d.received_at,
    )


def usage_rows(run: RunState, seq: int) -> list[UsageRow]:
    """Rows for the ``usage_recorded`` fact at ``seq``: reported usage wins over an estimate.

    An estimate arriving after a reported row for the same (turn, attempt) is written
    superseded; a reported row arriving after estimates re-emits them superseded, with a
    higher version, so the ledger keeps exactly one current row per event.
    """
    fact = run.facts[seq]
    d = fact["d"]
    if d["scope"] != "provider_turn":
        return [_usage_row(run, seq, fact, superseded=False, version=1)]
    key = (d["turn"], d["attempt"])
    same = [(s, f) for s, f in run.facts.items() if s != seq and _provider_turn_key(f) == key]
    if d["usage"].get("estimated"):
        reported = any(not f["d"]["usage"].get("estimated") for _, f in same)
        return [_usage_row(run, seq, fact, superseded=reported, version=2 if reported else 1)]
    rows = [_usage_row(run, seq, fact, superseded=False, version=1)]
    for s, f in sorted(same):
        if f["d"]["usage"].get("estimated"):
            rows.append(_usage_row(run, s, f, superseded=True, version=2))
    return rows


def _provider_turn_key(fact: dict[str, Any]) -> tuple[int, int] | None:
    if fact["t"] != "usage_recorded" or fact["d"]["scope"] != "provider_turn":
        return None
    return fact["d"]["turn"], fact["d"]["attempt"]


def _usage_row(
    run: RunState, seq: int, fact: dict[str, Any], *, superseded: bool, version: int
) -> UsageRow:
    d, u = fact["d"], fact["d"]["usage"]
    m = run.meta_value
    cost = u.get("cost")
    return UsageRow(
        event_id=fact["id"],
        run_id=run.run_id,
        seq=seq,
        tenant_id=m("tenant_id"),
        account_id=m("account_id"),
        provider=m("provider"),
        model=m("model"),
        scope=d["scope"],
        turn=d.get("turn"),
        attempt=d.get("attempt"),
        entry_id=d.get("entryId"),
        input_tokens=u.get("inputTokens"),
        output_tokens=u.get("outputTokens"),
        total_tokens=u.get("totalTokens"),
        cache_read_tokens=u.get("cacheReadTokens"),
        cache_write_tokens=u.get("cacheWriteTokens"),
        cost=None if cost is None else Decimal(str(cost)),
        currency=u.get("currency"),
        estimated=bool(u.get("estimated")),
        confidence=u.get("confidence"),
        recorded_at=from_us(fact["ts"]),
        superseded=superseded,
        version=version,
    )
