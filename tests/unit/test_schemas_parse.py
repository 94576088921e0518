"""Parsing record values: event classes, unknown types, batches, reasons, the wire round trip."""

from __future__ import annotations

import gc
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import orjson
import pytest
from pydantic import TypeAdapter, ValidationError

from prism import schemas
from prism.schemas import (
    KNOWN_EVENT_TYPES,
    SCHEMA_ID,
    TERMINAL_TYPES,
    AgentDenied,
    AgentEvent,
    AgentStarted,
    AgentStartedData,
    ContractViolation,
    ProviderTurnFinished,
    UnknownEvent,
    UsageRecorded,
    event_to_wire,
    is_terminal_agent_event_type,
    parse_batch,
    parse_event,
)
from tests.fixtures.events import DROP, EVENT_TYPES, event_bytes, make_event


def test_the_fixture_factory_covers_every_contract_type() -> None:
    assert set(EVENT_TYPES) == KNOWN_EVENT_TYPES


@pytest.mark.parametrize("type_", EVENT_TYPES)
def test_each_type_parses_into_its_own_class(type_: str) -> None:
    ev = parse_event(event_bytes(make_event(type_, run_id="run-7", seq=4)))
    assert not isinstance(ev, UnknownEvent)
    assert ev.type == type_
    assert (ev.run_id, ev.seq, ev.event_id) == ("run-7", 4, "run-7:4")


def test_provider_turn_fields_are_snake_case_typed_values() -> None:
    ev = parse_event(event_bytes(make_event("provider_turn_finished", seq=2)))
    assert isinstance(ev, ProviderTurnFinished)
    assert ev.schema_ == SCHEMA_ID
    assert ev.ts == datetime(2025, 1, 31, 12, 0, 2, tzinfo=UTC)
    assert ev.ts.utcoffset() == timedelta(0)
    assert ev.tenant_id == "t1"
    assert ev.agent is not None and ev.agent.definition_revision == "7"
    assert ev.model is not None and ev.model.provider == "anthropic"
    assert ev.bundle_digest == "sha256:" + "ab" * 32
    assert ev.data.budgets.run_input_used == 1200
    assert ev.data.tools.ids_hash == "sha256:tools-abc"
    assert ev.data.usage is not None
    assert ev.data.usage.cost == Decimal("0.0123")
    assert ev.data.usage.cache_write_tokens == 0  # an explicit zero stays zero
    assert ev.data.usage.estimated is None  # absent stays absent


def test_absent_cache_fields_stay_none() -> None:
    ev = parse_event(
        event_bytes(make_event("provider_turn_finished", cache={"cacheReadTokens": 5}))
    )
    assert isinstance(ev, ProviderTurnFinished)
    assert ev.data.cache is not None
    assert (ev.data.cache.cache_read_tokens, ev.data.cache.cache_write_tokens) == (5, None)


def test_cost_given_as_a_number_becomes_the_same_decimal() -> None:
    ev = parse_event(event_bytes(make_event("usage_recorded", usage={"cost": 0.1})))
    assert isinstance(ev, UsageRecorded)
    assert ev.data.usage.cost == Decimal("0.1")


def test_offsets_are_kept() -> None:
    ev = parse_event(
        event_bytes(make_event("agent_started", envelope={"ts": "2025-01-31T14:00:00+02:00"}))
    )
    assert ev.ts.utcoffset() == timedelta(hours=2)
    assert ev.ts == datetime(2025, 1, 31, 12, 0, tzinfo=UTC)


def test_unknown_type_keeps_its_raw_payload() -> None:
    payload: dict[str, Any] = {"note": "x", "nested": {"a": [1, None]}, "n": None}
    ev = parse_event(event_bytes(make_event("agent_thought_logged", seq=3, **payload)))
    assert isinstance(ev, UnknownEvent)
    assert ev.type == "agent_thought_logged"
    assert ev.data == payload
    assert ev.seq == 3
    assert not is_terminal_agent_event_type(ev.type)


@pytest.mark.parametrize(
    ("envelope", "path"),
    [({"seq": -1}, "seq"), ({"type": ""}, "type"), ({"data": "x"}, "data"), ({"ts": "now"}, "ts")],
)
def test_unknown_type_still_needs_a_valid_envelope(envelope: dict, path: str) -> None:
    event = make_event("agent_thought_logged", envelope=envelope)
    with pytest.raises(ContractViolation) as caught:
        parse_event(event_bytes(event))
    assert caught.value.code == "contract_violation"
    assert caught.value.reason.startswith(f"{path}:")


def test_missing_type_is_named_in_the_reason() -> None:
    with pytest.raises(ContractViolation) as caught:
        parse_event(event_bytes(make_event("agent_started", envelope={"type": DROP})))
    assert caught.value.reason == "type: missing required field"


def test_unknown_envelope_and_payload_fields_are_ignored() -> None:
    event = make_event("agent_denied", envelope={"producerVersion": "9.9", "region": {"x": 1}})
    event["data"]["futureField"] = [1, 2]
    ev = parse_event(event_bytes(event))
    wire = event_to_wire(ev)
    assert "producerVersion" not in wire and "region" not in wire
    assert wire["data"] == {"reason": "tenant quota exhausted"}


def test_parsed_events_are_frozen() -> None:
    ev = parse_event(event_bytes(make_event("agent_started")))
    with pytest.raises(ValidationError):
        ev.seq = 5  # type: ignore[misc]


def test_priced_estimate_reason_names_path_and_value() -> None:
    event = make_event("usage_recorded", usage={"estimated": True, "cost": "0.12"})
    with pytest.raises(ContractViolation) as caught:
        parse_event(event_bytes(event))
    assert caught.value.reason == (
        "data.usage.cost: priced estimate: estimated usage must not carry cost/currency "
        "(cost='0.12')"
    )
    assert str(caught.value) == caught.value.reason
    assert isinstance(caught.value, ValueError)


def test_long_values_are_truncated_in_reasons() -> None:
    with pytest.raises(ContractViolation) as caught:
        parse_event(event_bytes(make_event("agent_started", envelope={"runId": "r" * 5000})))
    reason = caught.value.reason
    assert reason.startswith("runId: String should have at most 128 characters (runId='rrr")
    assert reason.endswith("...)")
    assert len(reason) < 200


def test_several_errors_are_reported_on_one_line() -> None:
    event = make_event("provider_turn_finished", envelope={"seq": -1}, turn=0, stopReason="x")
    with pytest.raises(ContractViolation) as caught:
        parse_event(event_bytes(event))
    parts = caught.value.reason.split("; ")
    assert [p.split(":")[0] for p in parts] == ["seq", "data.turn", "data.stopReason"]


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (b"", "not JSON"),
        (b"{", "not JSON"),
        (b'{"a": NaN}', "NaN and Infinity are not JSON numbers"),
        (b"\xff\xfe{}", "not UTF-8"),
        (b"[1, 2]", "JSON list, not an object"),
        (b'"text"', "JSON str, not an object"),
        (b"null", "JSON null, not an object"),
        (None, "tombstone"),
    ],
)
def test_unparsable_values(raw: bytes | None, fragment: str) -> None:
    with pytest.raises(ContractViolation) as caught:
        parse_event(raw)
    assert caught.value.code == "unparsable"
    assert fragment in caught.value.reason


def test_oversized_is_checked_before_parsing() -> None:
    raw = event_bytes(make_event("agent_started"))
    assert parse_event(raw, max_bytes=len(raw)).run_id == "r1"
    with pytest.raises(ContractViolation) as caught:
        parse_event(raw, max_bytes=len(raw) - 1)
    assert caught.value.code == "oversized"
    assert str(len(raw)) in caught.value.reason
    with pytest.raises(ContractViolation) as caught:
        parse_event(b"{" * 100, max_bytes=10)  # not JSON either: size wins
    assert caught.value.code == "oversized"


def test_parse_event_accepts_text() -> None:
    raw = event_bytes(make_event("agent_denied", reason="refusé"))
    ev = parse_event(raw.decode())
    assert isinstance(ev, AgentDenied)
    assert ev.data.reason == "refusé"


def test_parse_batch_mixes_events_and_violations_in_order() -> None:
    good = event_bytes(make_event("agent_started", seq=0))
    unknown = event_bytes(make_event("agent_thought_logged", seq=1, note="n"))
    bad = event_bytes(make_event("provider_turn_finished", seq=2, turn=0))
    big = event_bytes(make_event("agent_finished", seq=3, finishReason="x" * 2000))
    values = [good, b"not json", big, None, unknown, bad, b"[]", bytearray(good)]
    results = parse_batch(values, max_bytes=1000)
    assert len(results) == len(values)
    kinds = [r.code if isinstance(r, ContractViolation) else type(r).__name__ for r in results]
    assert kinds == [
        "AgentStarted",
        "unparsable",
        "oversized",
        "unparsable",
        "UnknownEvent",
        "contract_violation",
        "unparsable",
        "AgentStarted",
    ]
    violation = results[5]
    assert isinstance(violation, ContractViolation)
    assert violation.reason.startswith("data.turn:")


def test_parse_batch_restores_the_garbage_collector_state() -> None:
    values = [event_bytes(make_event("agent_started")), b"{"]
    assert gc.isenabled()
    parse_batch(values)
    assert gc.isenabled()
    gc.disable()
    try:
        parse_batch(values)
        assert not gc.isenabled()
    finally:
        gc.enable()


def _invalid_values() -> list[Any]:
    """One value per failure path of the parser: fast-path refusals and the slow checks."""
    return [
        event_bytes(make_event("provider_turn_finished", turn=0)),  # fast path refuses
        event_bytes(make_event("agent_thought_logged", envelope={"seq": -1})),  # unknown type
        b"{not json",
        b"\xff\xfe{}",
        b"[1, 2]",
        b'{"seq": NaN}',
        None,
        "text \udcff",
        bytearray(event_bytes(make_event("usage_recorded", turn=DROP))),
    ]


@pytest.mark.parametrize(
    "parse", [parse_batch, schemas.parse_any_batch, schemas.parse_channel_batch]
)
def test_parsing_invalid_records_creates_no_reference_cycles(parse: Any) -> None:
    values = _invalid_values() * 20
    results = parse(values)  # warm up: the first use may build cached validators
    assert all(isinstance(r, ContractViolation) for r in results)
    del results
    gc.collect()
    gc.disable()
    try:
        results = parse(values)
        assert all(isinstance(r, ContractViolation) for r in results)
        assert all(r.__traceback__ is None and r.__context__ is None for r in results)
        del results
        unreachable = gc.collect()
    finally:
        gc.enable()
    # Before the fix every failure kept its traceback, whose frame held the output list:
    # one cycle (about a dozen objects) per bad record for the collector to find.
    assert unreachable == 0


@pytest.mark.parametrize("type_", [*EVENT_TYPES, "agent_thought_logged"])
def test_wire_round_trip(type_: str) -> None:
    overrides: dict[str, Any] = {} if type_ in EVENT_TYPES else {"note": "n"}
    ev = parse_event(event_bytes(make_event(type_, **overrides)))
    wire = event_to_wire(ev)
    assert parse_event(orjson.dumps(wire)) == ev
    assert wire["schema"] == SCHEMA_ID and wire["runId"] == "r1"
    assert "sessionId" not in wire  # absent fields are omitted, not null


def test_wire_form_writes_cost_as_a_plain_decimal_string() -> None:
    ev = parse_event(event_bytes(make_event("usage_recorded", usage={"cost": 0.0000001})))
    wire = event_to_wire(ev)
    assert wire["data"]["usage"] == {"cost": "0.0000001"}
    assert parse_event(orjson.dumps(wire)) == ev


def test_events_can_be_built_by_attribute_name() -> None:
    ev = AgentStarted(
        schema_=SCHEMA_ID,
        event_id="e1",
        run_id="r1",
        seq=0,
        type="agent_started",
        ts=datetime(2025, 1, 1, tzinfo=timezone(timedelta(hours=1))),
        tenant_id="t",
        data=AgentStartedData(idempotency_key="k"),
    )
    assert event_to_wire(ev)["data"] == {"idempotencyKey": "k"}
    assert event_to_wire(ev)["ts"] == "2025-01-01T00:00:00+01:00"
    with pytest.raises(ValidationError, match="timezone"):
        AgentStarted(
            schema_=SCHEMA_ID,
            event_id="e1",
            run_id="r1",
            seq=0,
            type="agent_started",
            ts=datetime(2025, 1, 1),
            data=AgentStartedData(),
        )


def test_agent_event_union_dispatches_python_dicts_and_instances() -> None:
    adapter = TypeAdapter(AgentEvent)
    assert isinstance(adapter.validate_python(make_event("usage_recorded")), UsageRecorded)
    unknown = adapter.validate_python(make_event("agent_thought_logged", note="n"))
    assert isinstance(unknown, UnknownEvent) and unknown.data == {"note": "n"}
    ev = parse_event(event_bytes(make_event("error")))
    assert adapter.validate_python(ev) is ev
    with pytest.raises(ValidationError):
        adapter.validate_python(make_event("error", error=DROP))


def test_unknown_event_refuses_contract_types() -> None:
    with pytest.raises(ValidationError, match="contract type"):
        UnknownEvent.model_validate(make_event("error"))


@pytest.mark.parametrize("type_", [*EVENT_TYPES, "agent_thought_logged"])
def test_terminal_predicate(type_: str) -> None:
    expected = type_ in {"agent_finished", "agent_denied", "error"}
    assert is_terminal_agent_event_type(type_) is expected
    assert (type_ in TERMINAL_TYPES) is expected


def test_schema_field_accepts_exactly_schema_id() -> None:
    assert SCHEMA_ID == "prism.agent-event/v1"
    assert parse_event(event_bytes(make_event("agent_started"))).schema_ == SCHEMA_ID


def test_limit_records_are_not_terminal() -> None:
    assert not is_terminal_agent_event_type("run_limit_exceeded")
    assert not is_terminal_agent_event_type("budget_exhausted")
    assert schemas.MAX_EVENT_BYTES == 1_048_576
