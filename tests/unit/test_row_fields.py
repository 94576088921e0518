"""Each ledger row builder puts every value in the column of its name.

The builders pass a row's values by position (a 22-field dataclass built by keyword cost
3.7 us more per row, about one row per event), so a value in the wrong place would still
type-check when two neighbouring columns share a type (``tenant_id`` and ``account_id``,
``input_tokens`` and ``output_tokens``). Every input here is distinct, and each row is
compared with its expected values by column name.
"""

from __future__ import annotations

import dataclasses
from decimal import Decimal

from prism.pipeline.core._rows import _turn_row, quarantine_row, raw_row, usage_row
from prism.pipeline.core._run import from_us

TS = 1_764_000_000_123_456
RECEIVED = 1_764_000_001_654_321
OWNER = {
    "tenant_id": "owner-tenant",
    "account_id": "owner-account",
    "user_id": "owner-user",
    "provider": "owner-provider",
    "model": "owner-model",
}
ENVELOPE = {
    "tenant_id": "event-tenant",
    "session_id": "event-session",
    "agent_id": "event-agent",
    "provider": "event-provider",
    "model": "event-model",
    "parent_run_id": "event-parent",
    "bundle_digest": "event-digest",
}
SOURCE = ["topic-a", 7, 4242, RECEIVED, "00-trace-span-01"]


def _fact(type_: str, data: dict[str, object]) -> dict[str, object]:
    return {"s": 11, "n": 3, "t": type_, "ts": TS, "d": data, "e": dict(ENVELOPE), "src": SOURCE}


def _as_dict(row: object) -> dict[str, object]:
    return {f.name: getattr(row, f.name) for f in dataclasses.fields(row)}  # type: ignore[arg-type]


def test_raw_row_columns() -> None:
    fact = _fact("tool_called", {"toolId": "t1"})
    row = raw_row("run-1", "event-1", fact, OWNER, 99, True)
    assert _as_dict(row) == {
        "event_id": "event-1",
        "run_id": "run-1",
        "seq": 11,
        "type": "tool_called",
        "ts": from_us(TS),
        "tenant_id": "owner-tenant",
        "account_id": "owner-account",
        "user_id": "owner-user",
        "session_id": "event-session",
        "agent_id": "event-agent",
        "provider": "event-provider",
        "model": "event-model",
        "parent_run_id": "event-parent",
        "bundle_digest": "event-digest",
        "payload": '{"toolId":"t1"}',
        "traceparent": "00-trace-span-01",
        "source": "topic-a",
        "partition": 7,
        "offset": 4242,
        "received_at": from_us(RECEIVED),
        "version": 99,
        "retracted": True,
    }


def test_usage_row_columns() -> None:
    usage = {
        "inputTokens": 101,
        "outputTokens": 102,
        "totalTokens": 103,
        "cacheReadTokens": 104,
        "cacheWriteTokens": 105,
        "cost": 0.25,
        "currency": "EUR",
        "estimated": True,
        "confidence": "low",
    }
    data = {"scope": "provider_turn", "turn": 4, "attempt": 2, "entryId": "entry-9", "usage": usage}
    row = usage_row(
        "run-1", "event-1", _fact("usage_recorded", data), OWNER,
        superseded=True, version=98, retracted=False,
    )  # fmt: skip
    assert _as_dict(row) == {
        "event_id": "event-1",
        "run_id": "run-1",
        "seq": 11,
        "tenant_id": "owner-tenant",
        "account_id": "owner-account",
        "provider": "owner-provider",
        "model": "owner-model",
        "scope": "provider_turn",
        "turn": 4,
        "attempt": 2,
        "entry_id": "entry-9",
        "input_tokens": 101,
        "output_tokens": 102,
        "total_tokens": 103,
        "cache_read_tokens": 104,
        "cache_write_tokens": 105,
        "cost": Decimal("0.25"),
        "currency": "EUR",
        "estimated": True,
        "confidence": "low",
        "recorded_at": from_us(TS),
        "superseded": True,
        "version": 98,
        "retracted": False,
    }


def test_quarantine_row_columns() -> None:
    fact = _fact("tool_called", {"toolId": "t1"})
    row = quarantine_row(
        "run-1", "event-1", fact, OWNER, "post_terminal", version=97, retracted=True
    )
    values = _as_dict(row)
    payload = values.pop("payload")
    assert '"eventId":"event-1"' in str(payload) and '"tenantId":"event-tenant"' in str(payload)
    assert values == {
        "event_id": "event-1",
        "run_id": "run-1",
        "seq": 11,
        "type": "tool_called",
        "ts": from_us(TS),
        "tenant_id": "event-tenant",  # the event's own: it may be why it was quarantined
        "reason": "post_terminal",
        "source": "topic-a",
        "partition": 7,
        "offset": 4242,
        "received_at": from_us(RECEIVED),
        "version": 97,
        "retracted": True,
    }


def test_model_turn_row_columns() -> None:
    budgets = {"inputCap": 9000, "runInputBudget": 50000, "runInputUsed": 7000, "maxTurns": 12}
    data = {
        "stopReason": "tool_use",
        "latencyMs": 812,
        "tools": {"count": 6, "idsHash": "hash-6"},
        "cache": {"cacheReadTokens": 300, "cacheWriteTokens": 40},
        "usage": {"inputTokens": 1200},
        "budgets": budgets,
        "middleware": "never-read-for-model-turns",
    }
    chosen = {"inputTokens": 1201, "outputTokens": 202, "totalTokens": 1403, "confidence": "high"}
    row = _turn_row("run-1", "model", 5, 1, 13, _fact("provider_turn", data), chosen, OWNER, 96)
    assert _as_dict(row) == {
        "run_id": "run-1",
        "kind": "model",
        "turn": 5,
        "attempt": 1,
        "tenant_id": "owner-tenant",
        "provider": "owner-provider",
        "model": "owner-model",
        "seq": 13,
        "ts": from_us(TS),
        "stop_reason": "tool_use",
        "latency_ms": 812.0,
        "middleware": None,
        "tools_count": 6,
        "tools_ids_hash": "hash-6",
        "input_tokens": 1201,
        "output_tokens": 202,
        "total_tokens": 1403,
        "cache_read_tokens": 300,
        "cache_write_tokens": 40,
        "cache_hit_rate": 300 / 1200,
        "usage_source": "reported",
        "usage_confidence": "high",
        "input_cap": 9000,
        "run_input_budget": 50000,
        "run_input_used": 7000,
        "max_turns": 12,
        "version": 96,
        "retracted": False,
    }


def test_deterministic_turn_row_columns() -> None:
    data = {"middleware": "guard", "stopReason": "ignored", "latencyMs": 5, "tools": {"count": 2}}
    fact = _fact("deterministic_turn", data)
    row = _turn_row("run-1", "deterministic", 6, 0, 14, fact, {}, OWNER, 95)
    values = _as_dict(row)
    assert (values["kind"], values["turn"], values["attempt"], values["seq"]) == (
        "deterministic", 6, 0, 14,
    )  # fmt: skip
    assert values["middleware"] == "guard"
    assert values["stop_reason"] is None and values["latency_ms"] is None  # model turns' only
    assert values["tools_count"] == 2
    assert values["cache_read_tokens"] is None and values["cache_hit_rate"] is None
    assert values["usage_source"] is None and values["input_tokens"] is None
    assert values["version"] == 95 and values["retracted"] is False
