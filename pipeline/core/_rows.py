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

from ._run import from_us, iso_us
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
        "ts": iso_us(fact["ts"]),
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
    # by position, in the row's field order (tests/unit/test_row_fields.py): a keyword
    # call of a 22-field dataclass matches every name and cost 3.7 us more per row
    e: dict[str, Any] = fact["e"]  # typed: compiled, .get is a dict's, not a method call
    source, partition, offset, received_us, traceparent = fact["src"]
    return RawEventRow(
        event_id,
        run_id,
        fact["s"],  # seq
        fact["t"],  # type
        from_us(fact["ts"]),  # ts
        owner.get("tenant_id"),
        owner.get("account_id"),
        owner.get("user_id"),
        e.get("session_id"),
        e.get("agent_id"),
        e.get("provider"),
        e.get("model"),
        e.get("parent_run_id"),
        e.get("bundle_digest"),
        orjson.dumps(fact["d"]).decode(),  # payload
        traceparent,
        source,
        partition,
        offset,
        from_us(received_us),  # received_at
        version,
        retracted,
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
    d: dict[str, Any] = fact["d"]  # typed, as raw_row's envelope
    u: dict[str, Any] = d["usage"]
    cost = u.get("cost")
    return UsageRow(  # by position, in field order, as raw_row
        event_id,
        run_id,
        fact["s"],  # seq
        owner.get("tenant_id"),
        owner.get("account_id"),
        owner.get("provider"),
        owner.get("model"),
        d["scope"],
        d.get("turn"),
        d.get("attempt"),
        d.get("entryId"),
        u.get("inputTokens"),
        u.get("outputTokens"),
        u.get("totalTokens"),
        u.get("cacheReadTokens"),
        u.get("cacheWriteTokens"),
        None if cost is None else Decimal(str(cost)),
        u.get("currency"),
        bool(u.get("estimated")),
        u.get("confidence"),
        from_us(fact["ts"]),  # recorded_at
        superseded,
        version,
        retracted,
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
    return QuarantineRow(  # by position, in field order, as raw_row
        event_id,
        run_id,
        fact["s"],  # seq
        fact["t"],  # type
        from_us(fact["ts"]),  # ts
        fact["e"].get("tenant_id", owner.get("tenant_id")),
        reason,
        orjson.dumps(wire_of(run_id, event_id, fact)).decode(),  # payload
        source,
        partition,
        offset,
        from_us(received_us),  # received_at
        version,
        retracted,
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
    d: dict[str, Any] = fact["d"]  # typed, as raw_row's envelope
    model = kind == "model"
    read, write, inp = turn_cache_inputs(d) if model else (None, None, None)
    budgets: dict[str, Any] = d.get("budgets") or {}
    tools: dict[str, Any] = d.get("tools") or {}
    latency = d.get("latencyMs") if model else None
    return TurnRow(  # by position, in field order, as raw_row
        run_id,
        kind,
        turn,
        attempt,
        owner.get("tenant_id"),
        owner.get("provider"),
        owner.get("model"),
        seq,
        from_us(fact["ts"]),  # ts
        d.get("stopReason") if model else None,
        None if latency is None else float(latency),
        None if model else d.get("middleware"),
        tools.get("count"),
        tools.get("idsHash"),
        usage.get("inputTokens", inp),
        usage.get("outputTokens"),
        usage.get("totalTokens"),
        read,  # cache_read_tokens
        write,  # cache_write_tokens
        (read / inp) if read is not None and inp else None,  # cache_hit_rate
        None if not usage else ("estimated" if usage.get("estimated") else "reported"),
        usage.get("confidence"),
        budgets.get("inputCap"),
        budgets.get("runInputBudget"),
        budgets.get("runInputUsed"),
        budgets.get("maxTurns"),
        version,
    )
