"""The channel-operation family and ``guardrail_denied``: models, parsing, dispatch, JSON Schema."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from jsonschema import Draft202012Validator

from prism.schemas import (
    CHANNEL_FINAL_STATES,
    CHANNEL_JSON_SCHEMA_PATH,
    CHANNEL_OPEN_STATES,
    CHANNEL_SCHEMA_ID,
    CHANNEL_TRANSITIONS,
    AgentStarted,
    ChannelOperation,
    ContractViolation,
    GuardrailDenied,
    UnknownEvent,
    event_to_wire,
    is_legal_channel_transition,
    is_terminal_agent_event_type,
    parse_any_batch,
    parse_batch,
    parse_channel_batch,
    parse_channel_operation,
    parse_event,
)
from tests.fixtures.events import DROP, event_bytes, make_event


def op(**overrides: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "schema": CHANNEL_SCHEMA_ID,
        "eventId": "ce-1",
        "operationId": "op-1",
        "seq": 0,
        "ts": "2026-11-30T12:00:00Z",
        "connectionId": "telegram:support",
        "kind": "message",
        "state": "admitted",
        "runId": "run-1",
        "tenantId": "acme",
        "agent": {"id": "support-bot"},
    }
    for key, value in overrides.items():
        if value is DROP:
            record.pop(key, None)
        else:
            record[key] = value
    return record


VALID = [
    ("admitted", op()),
    ("executing", op(state="executing", seq=1)),
    ("delivered", op(state="delivered", seq=2)),
    ("notice", op(state="notice_delivered", seq=2, reason="run failed")),
    ("send-threw", op(state="delivery_unknown", seq=2)),
    ("process-died", op(state="execution_unknown", seq=2)),
    ("reconciled", op(state="reconciled", seq=3, reason="resent")),
    ("cancelled", op(state="cancelled", seq=2, reason="user /cancel")),
    ("duplicate", op(state="duplicate", duplicate=True)),
    ("denied", op(state="denied", operationId=DROP, reason="capacity", runId=DROP)),
    ("denied-with-id", op(state="denied", reason="unauthorized")),
    ("notify", op(kind="notify")),
    ("minimal", op(runId=DROP, tenantId=DROP, agent=DROP)),
]
INVALID = [
    ("no-operation-id", op(operationId=DROP), "operationId:"),
    ("null-operation-id", op(operationId=None), "operationId:"),
    ("denied-without-reason", op(state="denied", operationId=DROP), "reason:"),
    ("unknown-state", op(state="lost"), "state:"),
    ("unknown-kind", op(kind="voice"), "kind:"),
    ("no-connection", op(connectionId=DROP), "connectionId:"),
    ("empty-connection", op(connectionId=""), "connectionId:"),
    ("seq-too-large", op(seq=10_000_001), "seq:"),
    ("ts-far-future", op(ts="2200-01-01T00:00:00Z"), "ts:"),
    ("reason-too-long", op(state="cancelled", reason="x" * 257), "reason:"),
    ("duplicate-not-bool", op(duplicate="yes"), "duplicate:"),
]


@pytest.fixture(scope="module")
def validator() -> Draft202012Validator:
    schema = json.loads(CHANNEL_JSON_SCHEMA_PATH.read_text(encoding="utf-8"))
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


@pytest.mark.parametrize(("name", "record"), VALID, ids=[v[0] for v in VALID])
def test_valid_records_parse_and_validate(
    validator: Draft202012Validator, name: str, record: dict[str, Any]
) -> None:
    parsed = parse_channel_operation(orjson.dumps(record))
    assert isinstance(parsed, ChannelOperation)
    assert parsed.state == record["state"]
    assert parsed.key == record.get("operationId", record["connectionId"])
    assert [e.message for e in validator.iter_errors(record)] == []
    assert parse_channel_operation(orjson.dumps(event_to_wire(parsed))) == parsed


@pytest.mark.parametrize(("name", "record", "path"), INVALID, ids=[v[0] for v in INVALID])
def test_invalid_records_are_violations_naming_the_field(
    validator: Draft202012Validator, name: str, record: dict[str, Any], path: str
) -> None:
    with pytest.raises(ContractViolation) as caught:
        parse_channel_operation(orjson.dumps(record))
    assert caught.value.code == "contract_violation"
    assert caught.value.reason.startswith(path), caught.value.reason
    if name != "reason-too-long":  # byte lengths are the pipeline's check
        assert list(validator.iter_errors(record)), f"{name} should fail the JSON Schema too"


def test_missing_operation_id_names_the_state() -> None:
    with pytest.raises(ContractViolation, match=r"operationId: .*state is executing"):
        parse_channel_operation(orjson.dumps(op(operationId=DROP, state="executing")))


def test_a_denial_is_keyed_by_its_connection() -> None:
    parsed = parse_channel_operation(orjson.dumps(VALID[9][1]))
    assert (parsed.operation_id, parsed.key, parsed.reason) == (
        None,
        "telegram:support",
        "capacity",
    )


def test_transition_table_is_the_contracts() -> None:
    assert CHANNEL_TRANSITIONS[None] == {"admitted", "denied", "duplicate"}
    assert CHANNEL_TRANSITIONS["executing"] == {
        "delivered",
        "notice_delivered",
        "delivery_unknown",
        "execution_unknown",
        "cancelled",
    }
    assert {"delivery_unknown", "execution_unknown"} == CHANNEL_OPEN_STATES
    assert {
        "delivered",
        "notice_delivered",
        "cancelled",
        "reconciled",
        "denied",
        "duplicate",
    } == CHANNEL_FINAL_STATES
    assert is_legal_channel_transition("delivery_unknown", "reconciled")
    assert not is_legal_channel_transition("admitted", "delivered")  # skips executing
    assert not is_legal_channel_transition("delivered", "reconciled")
    assert not is_legal_channel_transition(None, "executing")
    assert not is_legal_channel_transition("denied", "admitted")


def test_any_batch_dispatches_on_schema_and_keeps_order() -> None:
    agent = event_bytes(make_event("agent_started"))
    channel = orjson.dumps(op())
    # An agent event that merely mentions the channel schema in its payload stays an event.
    mention = event_bytes(make_event("agent_denied", reason=f"{CHANNEL_SCHEMA_ID} quota"))
    broken_channel = orjson.dumps(op(state="lost"))
    other_family = orjson.dumps({**make_event("agent_started"), "schema": "prism.other/v9"})
    unknown = event_bytes(make_event("memory_compacted", beforeTokens=3))
    values = [agent, channel, b"{", mention, broken_channel, other_family, unknown, None]
    results = parse_any_batch(values)
    kinds = [r.code if isinstance(r, ContractViolation) else type(r).__name__ for r in results]
    assert kinds == [
        "AgentStarted",
        "ChannelOperation",
        "unparsable",
        "AgentDenied",
        "contract_violation",
        "contract_violation",
        "UnknownEvent",
        "unparsable",
    ]
    assert results[4].reason.startswith("state:")  # type: ignore[union-attr]
    assert results[5].reason.startswith("schema:")  # type: ignore[union-attr]
    assert "prism.other/v9" in results[5].reason  # type: ignore[union-attr]


def test_agent_only_and_channel_only_batches_refuse_the_other_family() -> None:
    agent = event_bytes(make_event("agent_started"))
    channel = orjson.dumps(op())
    (as_agent,) = parse_batch([channel])
    assert isinstance(as_agent, ContractViolation) and as_agent.reason.startswith("schema:")
    (as_channel,) = parse_channel_batch([agent])
    assert isinstance(as_channel, ContractViolation) and as_channel.reason.startswith("schema:")
    assert isinstance(parse_batch([agent])[0], AgentStarted)
    assert isinstance(parse_channel_batch([channel])[0], ChannelOperation)


def test_any_batch_matches_parse_batch_on_agent_events() -> None:
    values = [
        event_bytes(make_event(t, seq=n))
        for n, t in enumerate(("agent_started", "usage_recorded", "guardrail_denied", "error"))
    ]
    values += [b"[]", event_bytes(make_event("usage_recorded", turn=DROP)), b"x" * 50]
    any_results = parse_any_batch(values, max_bytes=2000)
    agent_results = parse_batch(values, max_bytes=2000)
    assert [repr(r) for r in any_results] == [repr(r) for r in agent_results]


def test_oversized_channel_records_are_violations() -> None:
    record = orjson.dumps(op(reason="x" * 200, state="cancelled"))
    (result,) = parse_channel_batch([record], max_bytes=100)
    assert isinstance(result, ContractViolation) and result.code == "oversized"


# -- guardrail_denied -------------------------------------------------------------------


def test_guardrail_denial_parses_and_is_not_terminal() -> None:
    ev = parse_event(event_bytes(make_event("guardrail_denied")))
    assert isinstance(ev, GuardrailDenied)
    assert (ev.data.rule, ev.data.stage, ev.data.tool, ev.data.turn) == (
        "pack:destructive-commands/no-recursive-delete",
        "before_tool",
        "shell.exec",
        2,
    )
    assert not is_terminal_agent_event_type("guardrail_denied")
    minimal = parse_event(
        event_bytes(make_event("guardrail_denied", turn=DROP, tool=DROP, stage="output"))
    )
    assert isinstance(minimal, GuardrailDenied) and minimal.data.turn is None


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"rule": "secrets-hygiene/no-secret-args"}, "data.rule: should be 'pack:<pack>/<rule>'"),
        ({"rule": "pack:/x"}, "data.rule:"),
        ({"rule": "pack:a/" + "r" * 129}, "data.rule:"),
        ({"rule": DROP}, "data.rule: missing required field"),
        ({"stage": "during_tool"}, "data.stage:"),
        ({"turn": 0}, "data.turn:"),
    ],
)
def test_guardrail_denial_rules(overrides: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ContractViolation) as caught:
        parse_event(event_bytes(make_event("guardrail_denied", **overrides)))
    assert caught.value.reason.startswith(fragment), caught.value.reason


def test_guardrail_denial_is_a_contract_type_not_an_unknown_one() -> None:
    (ev,) = parse_batch([event_bytes(make_event("guardrail_denied"))])
    assert not isinstance(ev, UnknownEvent)
