"""Ledger rows and topic records built from facts: raw event, usage, quarantine, turn rows.

Rows carry the run's owner values (tenant, account, user, provider, model), never the
event's own: an event that omitted its tenant is billed to the run's (rule 11).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import orjson

from prism.schemas import (
    AgentEvent,
    QuarantineRow,
    RawEventRow,
    TurnRow,
    UsageRow,
    redact_unknown_data,
)

from ._run import from_us
from ._timeline import RunView, turn_cache_inputs
from ._types import OutRecord

__all__ = [
    "OWNER_FIELDS",
    "data_of",
    "quarantine_record",
    "quarantine_row",
    "raw_row",
    "turn_rows",
    "usage_row",
    "wire_of",
]

OWNER_FIELDS = ("tenant_id", "account_id", "user_id", "provider", "model")
_Fact = dict[str, Any]


def data_of(ev: AgentEvent, redact_keys: frozenset[str]) -> dict[str, Any]:
    """The event's payload in wire form (camelCase, absent fields omitted).

    The contract keeps content out of known types; an unknown type's free-form ``data``
    loses every key on ``redact_keys`` (arguments, prompts, results, secrets...).
    """
    data = ev.data
    if isinstance(data, dict):
        return redact_unknown_data(data, redact_keys)
    return data.model_dump(mode="json", by_alias=True, exclude_none=True)


def wire_of(run_id: str, event_id: str, fact: _Fact) -> dict[str, Any]:
    """The event's envelope rebuilt from its fact, in wire form (absent fields omitted)."""
    e = fact["e"]
    wire: dict[str, Any] = {
        "schema": "prism.agent-event/v1",
        "eventId": event_id,
        "runId": run_id,
        "seq": fact["s"],
        "type": fact["t"],
        "ts": from_us(fact["ts"]).isoformat(),
    }
    for name, key in (
        ("session_id", "sessionId"),
        ("tenant_id", "tenantId"),
        ("account_id", "accountId"),
        ("user_id", "userId"),
        ("bundle_digest", "bundleDigest"),
    ):
        if name in e:
            wire[key] = e[name]
    if "agent_id" in e:
        wire["agent"] = {"id": e["agent_id"]} | (
            {"definitionRevision": e["agent_definition_revision"]}
            if "agent_definition_revision" in e
            else {}
        )
    if "provider" in e or "model" in e:
        wire["model"] = {"provider": e.get("provider"), "model": e.get("model")}
    if "parent_run_id" in e:
        wire["parent"] = {"runId": e["parent_run_id"], "delegationId": e.get("delegation_id")}
        if "child_id" in e:
            wire["parent"]["childId"] = e["child_id"]
    wire["data"] = fact["d"]
    return wire


def raw_row(
    run_id: str, event_id: str, fact: _Fact, owner: dict[str, Any], version: int, retracted: bool
) -> RawEventRow:
    e = fact["e"]
    source, partition, offset, received_us, traceparent = fact["src"]
    return RawEventRow(
        event_id=event_id,
        run_id=run_id,
        seq=fact["s"],
        type=fact["t"],
        ts=from_us(fact["ts"]),
        tenant_id=owner.get("tenant_id"),
        account_id=owner.get("account_id"),
        user_id=owner.get("user_id"),
        session_id=e.get("session_id"),
        agent_id=e.get("agent_id"),
        provider=e.get("provider"),
        model=e.get("model"),
        parent_run_id=e.get("parent_run_id"),
        bundle_digest=e.get("bundle_digest"),
        payload=orjson.dumps(fact["d"]).decode(),
        traceparent=traceparent,
        source=source,
        partition=partition,
        offset=offset,
        received_at=from_us(received_us),
        version=version,
        retracted=retracted,
    )


def usage_row(
    run_id: str,
    event_id: str,
    fact: _Fact,
    owner: dict[str, Any],
    *,
    superseded: bool,
    version: int,
    retracted: bool,
) -> UsageRow:
    """The usage row of a ``usage_recorded`` fact; superseded: a reported row outranks it."""
    d, u = fact["d"], fact["d"]["usage"]
    cost = u.get("cost")
    return UsageRow(
        event_id=event_id,
        run_id=run_id,
        seq=fact["s"],
        tenant_id=owner.get("tenant_id"),
        account_id=owner.get("account_id"),
        provider=owner.get("provider"),
        model=owner.get("model"),
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
        retracted=retracted,
    )


def quarantine_row(
    run_id: str,
    event_id: str,
    fact: _Fact,
    owner: dict[str, Any],
    reason: str,
    *,
    version: int,
    retracted: bool,
) -> QuarantineRow:
    source, partition, offset, received_us, _ = fact["src"]
    return QuarantineRow(
        event_id=event_id,
        run_id=run_id,
        seq=fact["s"],
        type=fact["t"],
        ts=from_us(fact["ts"]),
        tenant_id=fact["e"].get("tenant_id", owner.get("tenant_id")),
        reason=reason,
        payload=orjson.dumps(wire_of(run_id, event_id, fact)).decode(),
        source=source,
        partition=partition,
        offset=offset,
        received_at=from_us(received_us),
        version=version,
        retracted=retracted,
    )


def quarantine_record(run_id: str, event_id: str, fact: _Fact, reason: str) -> OutRecord:
    """The ``.quarantine`` topic record: the envelope, the reason and the source position."""
    source, partition, offset, _, _ = fact["src"]
    return OutRecord(
        key=run_id.encode(),
        value=orjson.dumps(wire_of(run_id, event_id, fact)),
        headers=(
            ("reason", reason.encode()),
            ("source-topic", source.encode()),
            ("source-partition", str(partition).encode()),
            ("source-offset", str(offset).encode()),
        ),
    )


def turn_rows(
    run_id: str,
    facts: dict[str, _Fact],
    view: RunView,
    owner: dict[str, Any],
    emitted: dict[str, list[Any]],
    version: int,
) -> list[TurnRow]:
    """Turn rows whose content changed since ``emitted`` (updated in place), and retractions.

    A turn row depends on its turn event, the usage chosen for it and the owner values;
    ``emitted`` maps ``kind|turn|attempt`` to those, as last written.
    """
    rows: list[TurnRow] = []
    owner_sig = [owner.get(k) for k in OWNER_FIELDS]
    current: set[str] = set()
    for (kind, turn, attempt), (seq, eid) in sorted(view.turn_seq.items()):
        key = f"{kind}|{turn}|{attempt}"
        current.add(key)
        chosen = view.turn_usage.get((turn, attempt)) if kind == "model" else None
        sig = [eid, chosen[3] if chosen else None, owner_sig, facts[eid]["ts"], seq]
        if emitted.get(key) == sig:
            continue
        emitted[key] = sig
        usage = chosen[2] if chosen is not None else {}
        rows.append(_turn_row(run_id, kind, turn, attempt, seq, facts[eid], usage, owner, version))
    for key in [k for k in emitted if k not in current]:
        gone_kind, gone_turn, gone_attempt = key.split("|")
        _, _, _, ts_us, gone_seq = emitted.pop(key)
        gone = {"s": gone_seq, "ts": ts_us, "d": {}}
        row = _turn_row(
            run_id, gone_kind, int(gone_turn), int(gone_attempt), gone_seq, gone, {}, owner, version
        )
        row.retracted = True
        rows.append(row)
    return rows


def _turn_row(
    run_id: str,
    kind: str,
    turn: int,
    attempt: int,
    seq: int,
    fact: _Fact,
    usage: dict[str, Any],
    owner: dict[str, Any],
    version: int,
) -> TurnRow:
    d = fact["d"]
    model = kind == "model"
    read, write, inp = turn_cache_inputs(d) if model else (None, None, None)
    budgets, tools = d.get("budgets") or {}, d.get("tools") or {}
    latency = d.get("latencyMs") if model else None
    return TurnRow(
        run_id=run_id,
        kind=kind,
        turn=turn,
        attempt=attempt,
        tenant_id=owner.get("tenant_id"),
        provider=owner.get("provider"),
        model=owner.get("model"),
        seq=seq,
        ts=from_us(fact["ts"]),
        stop_reason=d.get("stopReason") if model else None,
        latency_ms=None if latency is None else float(latency),
        middleware=None if model else d.get("middleware"),
        tools_count=tools.get("count"),
        tools_ids_hash=tools.get("idsHash"),
        input_tokens=usage.get("inputTokens", inp),
        output_tokens=usage.get("outputTokens"),
        total_tokens=usage.get("totalTokens"),
        cache_read_tokens=read,
        cache_write_tokens=write,
        cache_hit_rate=(read / inp) if read is not None and inp else None,
        usage_source=None if not usage else ("estimated" if usage.get("estimated") else "reported"),
        usage_confidence=usage.get("confidence"),
        input_cap=budgets.get("inputCap"),
        run_input_budget=budgets.get("runInputBudget"),
        run_input_used=budgets.get("runInputUsed"),
        max_turns=budgets.get("maxTurns"),
        version=version,
    )
