"""Rule 13, bounded values: hostile numbers and times are violations naming field and value,
and nothing the contract accepts can fail to fit its ledger column."""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

import orjson
import pytest
from pydantic.alias_generators import to_snake

from prism.schemas import (
    MAX_SAFE_INTEGER,
    MAX_SEQ,
    MAX_UINT32,
    ContractViolation,
    parse_any_batch,
    parse_event,
)
from tests.fixtures.events import make_event

_PLACEHOLDER = "__value__"

# ClickHouse ranges of the ledger's columns.
INT64 = (-(2**63), 2**63 - 1)


@dataclass(frozen=True)
class Field:
    type_: str  # agent event type, or "channel" for a channel-operation record
    path: tuple[str | int, ...]  # wire path from the envelope
    column: str  # Int64 | UInt32 | Float64 | Decimal | DateTime64 | JSON
    reason_path: str  # how the reason names the field

    @property
    def id(self) -> str:
        return f"{self.type_}:{self.reason_path}"


def _f(type_: str, *path: str | int, column: str, reason: str | None = None) -> Field:
    default = ".".join(str(p) if isinstance(p, str) else f"[{p}]" for p in path)
    return Field(type_, path, column, reason or default.replace(".[", "["))


_TOKENS = ("inputTokens", "outputTokens", "totalTokens", "cacheReadTokens", "cacheWriteTokens")
_BUDGETS = ("inputTokens", "inputCap", "runInputBudget", "runInputUsed", "turns", "maxTurns")

FIELDS: list[Field] = [
    _f("agent_started", "seq", column="Int64"),
    *(_f("usage_recorded", "data", "usage", t, column="Int64") for t in _TOKENS),
    *(_f("provider_turn_finished", "data", "usage", t, column="Int64") for t in _TOKENS[:3]),
    _f("provider_turn_finished", "data", "cache", "cacheReadTokens", column="Int64"),
    _f("provider_turn_finished", "data", "cache", "cacheWriteTokens", column="Int64"),
    *(_f("provider_turn_finished", "data", "budgets", b, column="Int64") for b in _BUDGETS),
    _f("provider_turn_finished", "data", "turn", column="UInt32"),
    _f("provider_turn_finished", "data", "attempt", column="UInt32"),
    _f("provider_turn_finished", "data", "tools", "count", column="UInt32"),
    _f("provider_turn_finished", "data", "latencyMs", column="Float64"),
    _f("usage_recorded", "data", "turn", column="UInt32"),
    _f("usage_recorded", "data", "attempt", column="UInt32"),
    _f("tool_call_finished", "data", "turn", column="UInt32"),
    _f("tool_call_finished", "data", "durationMs", column="Float64"),
    _f("deterministic_turn_finished", "data", "turn", column="UInt32"),
    _f("tool_narrowing_clamped", "data", "turn", column="UInt32"),
    _f("child_milestone", "data", "turn", column="UInt32"),
    _f("guardrail_denied", "data", "turn", column="UInt32"),
    _f("delegation_child_events_capped", "data", "cap", column="Int64"),
    _f("delegation_child_events_coalesced", "data", "dropped", column="Int64"),
    _f("run_limit_exceeded", "data", "maximum", column="Float64"),
    _f("run_limit_exceeded", "data", "observed", column="Float64"),
    _f("child_failed", "data", "breach", "maximum", column="Float64"),
    _f("child_failed", "data", "breach", "observed", column="Float64"),
    _f("budget_exhausted", "data", "closest", 0, "used", column="Float64"),
    _f("budget_exhausted", "data", "closest", 0, "maximum", column="Float64"),
    _f("usage_recorded", "data", "usage", "cost", column="Decimal"),
    _f("provider_turn_finished", "data", "usage", "cost", column="Decimal"),
    _f("agent_started", "ts", column="DateTime64"),
    _f("agent_started", "data", "limits", "maxTurns", column="JSON", reason="data.limits"),
    _f("budget_exhausted", "data", "counters", "turns", column="JSON", reason="data.counters"),
    _f("memory_compacted", "data", "beforeTokens", column="JSON", reason="data"),
    _f("channel", "seq", column="Int64"),
    _f("channel", "ts", column="DateTime64"),
]

# Raw JSON texts of hostile numbers (some are not even representable by a JSON encoder).
HOSTILE_NUMBERS = [
    "-1",
    "-0.5",
    "1.5",
    "1.0",
    "2147483648",
    "4294967295",
    "4294967296",
    "9007199254740991",
    "9007199254740992",
    "9223372036854775807",
    "9223372036854775808",
    "18446744073709551616",
    "1" + "0" * 30,
    "9" * 400,
    "1e300",
    "-1e300",
    "1e400",
    "-1e400",
    "NaN",
    '"5"',
    '"' + "1" * 41 + '"',
    "true",
    "null",
]
HOSTILE_COSTS = [
    *HOSTILE_NUMBERS,
    '"0.1234567890123"',
    '"1000000000000000"',
    '"1e3"',
    '"-1"',
    "1e-13",
    "0.30000000000000004",
    "1e15",
]
HOSTILE_TIMES = [
    '"9999-12-31T23:59:59Z"',
    '"2200-01-01T00:00:00Z"',
    '"2199-12-31T23:59:59-01:00"',
    '"1969-12-31T23:59:59.999Z"',
    '"1970-01-01T00:30:00+01:00"',
    '"0001-01-01T00:00:00Z"',
    '"2026-13-01T00:00:00Z"',
    "1700000000",
]


def _channel_record(**overrides: Any) -> dict[str, Any]:
    record = {
        "schema": "prism.channel-operation/v1",
        "eventId": "ce-1",
        "operationId": "op-1",
        "seq": 0,
        "ts": "2026-11-30T12:00:00Z",
        "connectionId": "telegram:main",
        "kind": "message",
        "state": "admitted",
    }
    record.update(overrides)
    return record


def _wire_with(field: Field, raw_json: str) -> bytes:
    """The event bytes with ``raw_json`` (verbatim JSON text) at the field's path."""
    event = _channel_record() if field.type_ == "channel" else make_event(field.type_)
    node: Any = event
    for step in field.path[:-1]:
        if isinstance(node, dict) and step not in node:
            node[step] = {}
        node = node[step]
    node[field.path[-1]] = _PLACEHOLDER
    return orjson.dumps(event).replace(f'"{_PLACEHOLDER}"'.encode(), raw_json.encode())


def _parse(raw: bytes) -> Any:
    (result,) = parse_any_batch([raw])
    if isinstance(result, ContractViolation):
        with pytest.raises(ContractViolation):  # the single-value API agrees
            if b"prism.channel-operation/v1" not in raw:
                parse_event(raw)
            else:
                raise result
    return result


def _stored(model: Any, field: Field) -> Any:
    """The parsed value the ledger would store for the field."""
    node = model
    for step in field.path:
        if isinstance(step, int) or isinstance(node, dict):
            node = node[step]
        else:
            node = getattr(node, "schema_" if step == "schema" else to_snake(step))
    return node


def _fits(column: str, value: Any) -> bool:
    if value is None:  # an optional field left absent: NULL
        return True
    if column == "Int64":
        return type(value) is int and INT64[0] <= value <= INT64[1]
    if column == "UInt32":
        return type(value) is int and 0 <= value <= 2**32 - 1
    if column == "Float64":
        return type(value) is float and math.isfinite(value)
    if column == "Decimal":  # Decimal(38, 12)
        return (
            isinstance(value, Decimal)
            and value.is_finite()
            and abs(value) < Decimal(10) ** 26
            and value.normalize().as_tuple().exponent >= -12  # type: ignore[operator]
        )
    if column == "DateTime64":  # DateTime64(3): 1900-01-01 .. 2299-12-31
        return isinstance(value, datetime) and 1900 <= value.astimezone().year <= 2299
    if column == "JSON":  # a payload column: must serialise, every integer inside Int64
        try:
            orjson.dumps(value)
        except orjson.JSONEncodeError:
            return False
        return not isinstance(value, float) or math.isfinite(value)
    raise AssertionError(column)


def _names_value(field: Field, raw_json: str, reason: str) -> bool:
    """Whether the reason shows the offending value (huge ones cut or summarised)."""
    value = json.loads(raw_json)
    if value is None:
        return "None" in reason or "missing" in reason
    if "<an integer of about " in reason:
        return type(value) is int and value.bit_length() > 320
    shown = reason.rpartition("=")[2].removesuffix(")").strip("'")
    if shown.endswith("..."):  # cut to a readable length
        return shown[:10].strip("'") in repr(value) or shown[:10] in format(Decimal(value), "f")
    if field.column == "Decimal" and type(value) in (int, float) and math.isfinite(value):
        return Decimal(shown) == Decimal(raw_json)
    if field.column == "DateTime64" and isinstance(value, str):
        return shown[:19] == value[:19]
    if isinstance(value, float) and not math.isfinite(value):
        return shown in ("inf", "-inf")
    return shown == repr(value).strip("'")


def _candidates(field: Field) -> list[str]:
    if field.column == "Decimal":
        return HOSTILE_COSTS
    if field.column == "DateTime64":
        return HOSTILE_TIMES
    return HOSTILE_NUMBERS


@pytest.mark.parametrize("field", FIELDS, ids=lambda f: f.id)
def test_hostile_values_are_violations_naming_field_and_value_or_fit_the_column(
    field: Field,
) -> None:
    problems = []
    for raw_json in _candidates(field):
        result = _parse(_wire_with(field, raw_json))
        if isinstance(result, ContractViolation):
            reason = result.reason
            if raw_json == "NaN":  # not JSON at all
                ok = result.code == "unparsable" and "NaN" in reason
            else:
                ok = (
                    result.code == "contract_violation"
                    and reason.startswith(f"{field.reason_path}:")
                    and _names_value(field, raw_json, reason)
                    and len(reason) < 400
                )
            if not ok:
                problems.append(f"{raw_json[:30]} -> {result.code}: {reason[:200]}")
        else:
            value = _stored(result, field)
            if not _fits(field.column, value):
                problems.append(
                    f"{raw_json[:30]} accepted as {value!r}: does not fit {field.column}"
                )
    assert problems == []


@pytest.mark.parametrize(
    ("field", "accepted", "rejected"),
    [
        (FIELDS[0], str(MAX_SEQ), str(MAX_SEQ + 1)),
        (FIELDS[1], str(MAX_SAFE_INTEGER), str(MAX_SAFE_INTEGER + 1)),
        (_f("usage_recorded", "data", "turn", column="UInt32"), str(MAX_UINT32), str(2**32)),
        (_f("usage_recorded", "data", "turn", column="UInt32"), "1", "0"),
        (_f("usage_recorded", "data", "usage", "cost", column="Decimal"), '"0"', '"-0.1"'),
        (
            _f("usage_recorded", "data", "usage", "cost", column="Decimal"),
            '"999999999999999.999999999999"',
            '"1000000000000000"',
        ),
        (
            _f("usage_recorded", "data", "usage", "cost", column="Decimal"),
            '"0.000000000001"',
            '"0.0000000000001"',
        ),
        (_f("usage_recorded", "data", "usage", "cost", column="Decimal"), "0.25", "1e-13"),
        (
            _f("agent_started", "ts", column="DateTime64"),
            '"2199-12-31T23:59:59.999Z"',
            '"2200-01-01T00:00:00Z"',
        ),
        (
            _f("agent_started", "ts", column="DateTime64"),
            '"1970-01-01T00:00:00Z"',
            '"1969-12-31T23:59:59.999Z"',
        ),
        (_f("channel", "seq", column="Int64"), str(MAX_SEQ), str(MAX_SEQ + 1)),
        (
            _f("agent_started", "data", "limits", "x", column="JSON", reason="data.limits"),
            str(-MAX_SAFE_INTEGER),
            str(-MAX_SAFE_INTEGER - 1),
        ),
    ],
    ids=lambda v: v.id if isinstance(v, Field) else v[:24],
)
def test_bounds_are_exact(field: Field, accepted: str, rejected: str) -> None:
    assert not isinstance(_parse(_wire_with(field, accepted)), ContractViolation)
    violation = _parse(_wire_with(field, rejected))
    assert isinstance(violation, ContractViolation)
    assert violation.reason.startswith(f"{field.reason_path}:"), violation.reason


def test_costs_keep_their_exact_decimal_value() -> None:
    field = _f("usage_recorded", "data", "usage", "cost", column="Decimal")
    for raw_json, expected in [
        ('"0.000000000001"', "0.000000000001"),
        ("0.1", "0.1"),
        ('"1.50000000000000000000"', "1.5"),
        ('"00000000000000000042.5"', "42.5"),
    ]:
        result = _parse(_wire_with(field, raw_json))
        assert _stored(result, field) == Decimal(expected)


def _random_number_texts(rng: random.Random, n: int) -> list[str]:
    texts = []
    for _ in range(n):
        shape = rng.randrange(4)
        if shape == 0:  # integers of every magnitude, both signs
            value = rng.getrandbits(rng.randrange(1, 80))
            texts.append(str(value if rng.random() < 0.8 else -value))
        elif shape == 1:  # floats of every exponent
            texts.append(repr(rng.uniform(-1, 1) * 10.0 ** rng.randrange(-20, 308)))
        elif shape == 2:  # decimal strings with random integer and fraction lengths
            whole = "".join(rng.choice("0123456789") for _ in range(rng.randrange(1, 20)))
            frac = "".join(rng.choice("0123456789") for _ in range(rng.randrange(0, 16)))
            texts.append(f'"{whole}.{frac}"' if frac else f'"{whole}"')
        else:  # exponent notation out of JSON-number range
            texts.append(f"{rng.randrange(1, 10)}e{rng.randrange(300, 400)}")
    return texts


@pytest.mark.parametrize(
    "field", [f for f in FIELDS if f.column != "DateTime64"], ids=lambda f: f.id
)
def test_no_accepted_value_fails_to_fit_its_ledger_column(field: Field) -> None:
    rng = random.Random(f"bounds:{field.id}")
    accepted = 0
    for raw_json in _random_number_texts(rng, 300):
        result = _parse(_wire_with(field, raw_json))
        if isinstance(result, ContractViolation):
            assert result.reason.startswith(f"{field.reason_path}:"), (raw_json, result.reason)
            continue
        accepted += 1
        value = _stored(result, field)
        assert _fits(field.column, value), f"{raw_json} accepted as {value!r}"
    assert accepted > 0  # the sweep reaches the accepted side too


@pytest.mark.parametrize(
    "field", [f for f in FIELDS if f.column == "DateTime64"], ids=lambda f: f.id
)
def test_no_accepted_time_fails_to_fit_datetime64(field: Field) -> None:
    rng = random.Random(f"times:{field.id}")
    accepted = 0
    for _ in range(400):
        year = rng.choice([rng.randrange(1, 10000), rng.randrange(1960, 2210)])
        offset = rng.choice(["Z", "+14:00", "-12:00", "+00:30"])
        day = f"{year:04d}-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}"
        text = f'"{day}T23:59:59.999{offset}"'
        result = _parse(_wire_with(field, text))
        if isinstance(result, ContractViolation):
            assert result.reason.startswith("ts:"), result.reason
            continue
        accepted += 1
        assert _fits("DateTime64", _stored(result, field)), text
    assert accepted > 0
