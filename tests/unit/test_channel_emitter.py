"""ChannelEmitter and guardrail denials: seq per operation, ids, keys and topics come out right."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from typing import Any

import orjson
import pytest
from jsonschema import Draft202012Validator

from prism.runtime import (
    DEFAULT_CHANNEL_TOPIC,
    ChannelEmitter,
    InMemoryPublisher,
    InvalidEvent,
    Record,
    channel_topic_for,
)
from prism.runtime._buffer import BufferedPublisher
from prism.schemas import (
    CHANNEL_JSON_SCHEMA_PATH,
    ChannelOperation,
    GuardrailDenied,
    parse_channel_operation,
    parse_event,
)

TS_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}\+00:00$")


def test_seq_counts_per_operation_and_operations_do_not_share_it() -> None:
    pub = InMemoryPublisher()
    a = pub.channel("telegram:support", "op-a", tenant_id="acme")
    b = pub.channel("telegram:support", "op-b", tenant_id="acme", kind="command")
    a.emit("admitted")
    b.emit("admitted")
    a.emit("executing", run_id="run-1")
    a.emit("delivered")
    b.emit("executing")
    assert [(e["seq"], e["state"]) for e in pub.operations_of("op-a")] == [
        (0, "admitted"),
        (1, "executing"),
        (2, "delivered"),
    ]
    assert pub.states_of("op-b") == ["admitted", "executing"]
    assert (a.next_seq, a.state, b.next_seq) == (3, "delivered", 2)
    assert {e["kind"] for e in pub.operations_of("op-b")} == {"command"}


def test_records_carry_uuid7_ids_utc_times_and_the_envelope() -> None:
    pub = InMemoryPublisher()
    op = pub.channel("signal:ops", "op-1", tenant_id="acme", session_id="s-1", agent="triage")
    op.emit("admitted")
    op.emit("executing", run_id="run-9")
    op.emit("delivery_unknown")  # the run id learned at executing stays on later records
    ids = [e["eventId"] for e in pub.events]
    assert all(uuid.UUID(i).version == 7 for i in ids) and ids == sorted(ids)
    assert all(TS_RE.match(e["ts"]) for e in pub.events)
    last = pub.events[-1]
    assert last == {
        "schema": "prism.channel-operation/v1",
        "eventId": ids[-1],
        "operationId": "op-1",
        "seq": 2,
        "ts": last["ts"],
        "connectionId": "signal:ops",
        "kind": "message",
        "state": "delivery_unknown",
        "runId": "run-9",
        "sessionId": "s-1",
        "tenantId": "acme",
        "agent": {"id": "triage"},
    }
    assert "runId" not in pub.events[0]


def test_operations_go_to_the_channel_topic_keyed_by_operation_id() -> None:
    pub = InMemoryPublisher()
    pub.run("run-1", tenant_id="acme").emit("agent_started", {})
    pub.channel("telegram:support", "op-7").emit("admitted")
    pub.deny("telegram:support", "capacity", tenant_id="acme")
    agent, op, denial = pub.records
    assert (agent.key, agent.topic) == (b"run-1", "prism.agent-events")
    assert DEFAULT_CHANNEL_TOPIC == "prism.channel-operations"
    assert (op.key, op.topic) == (b"op-7", "prism.channel-operations")
    assert (denial.key, denial.topic) == (b"telegram:support", "prism.channel-operations")
    assert dict(denial.headers)["content-type"] == b"application/json"
    assert [r.key for r in pub.records_on("prism.channel-operations")] == [
        b"op-7",
        b"telegram:support",
    ]
    assert pub.records_on("prism.agent-events") == [agent]


def test_a_denial_has_no_operation_id_and_names_its_reason() -> None:
    pub = InMemoryPublisher()
    result = pub.deny("telegram:support", "capacity", kind="approval", tenant_id="acme")
    assert result.accepted is True
    (denial,) = pub.denials("telegram:support")
    assert "operationId" not in denial
    assert (denial["state"], denial["reason"], denial["kind"], denial["seq"]) == (
        "denied",
        "capacity",
        "approval",
        0,
    )
    assert pub.denials("telegram:other") == []


def test_the_channel_topic_follows_the_agent_topics_prefix() -> None:
    assert channel_topic_for("acme.agent-events") == "acme.channel-operations"
    assert channel_topic_for("custom-topic") == "prism.channel-operations"
    pub = InMemoryPublisher(topic="acme.agent-events")
    pub.channel("c", "op").emit("admitted")
    assert pub.records[0].topic == "acme.channel-operations"
    explicit = InMemoryPublisher(channel_topic="ops.channels")
    explicit.channel("c", "op").emit("admitted")
    assert explicit.records[0].topic == "ops.channels"


def test_invalid_records_raise_and_use_up_no_seq() -> None:
    pub = InMemoryPublisher()
    op = pub.channel("telegram:support", "op-1")
    op.emit("admitted")
    with pytest.raises(InvalidEvent, match="state"):
        op.emit("lost")
    with pytest.raises(InvalidEvent, match="reason"):
        op.emit("cancelled", reason="x" * 300)
    op.emit("executing")
    assert [e["seq"] for e in pub.events] == [0, 1]
    denial = pub.channel("telegram:support")  # no operation id: only a denial is valid
    with pytest.raises(InvalidEvent, match="operationId"):
        denial.emit("admitted")
    with pytest.raises(InvalidEvent, match="reason"):
        denial.emit("denied")
    assert denial.next_seq == 0
    assert pub.stats.rejected_invalid == 4


def test_bad_arguments_are_refused_at_once() -> None:
    pub = InMemoryPublisher()
    with pytest.raises(ValueError, match="connection_id"):
        ChannelEmitter(pub, "")
    with pytest.raises(ValueError, match="operation_id"):
        ChannelEmitter(pub, "c", "")
    with pytest.raises(ValueError, match="first_seq"):
        ChannelEmitter(pub, "c", "op", first_seq=-1)


def test_first_seq_lets_another_process_reconcile_an_operation() -> None:
    pub = InMemoryPublisher()
    host = pub.channel("telegram:support", "op-3", first_seq=3)
    host.emit("reconciled", reason="acknowledged")
    (record,) = pub.events
    assert (record["seq"], record["reason"]) == (3, "acknowledged")


def test_every_record_parses_and_validates_against_the_json_schema() -> None:
    pub = InMemoryPublisher()
    op = pub.channel("telegram:support", "op-1", tenant_id="acme", agent={"id": "bot"})
    for state in ("admitted", "executing", "execution_unknown", "reconciled"):
        op.emit(state, reason="resent" if state == "reconciled" else None)
    pub.channel("telegram:support", "op-2").emit("duplicate", duplicate=True)
    pub.deny("telegram:support", "unauthorized")
    schema = json.loads(CHANNEL_JSON_SCHEMA_PATH.read_text(encoding="utf-8"))
    validator = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
    for record, event in zip(pub.records, pub.events, strict=True):
        parsed = parse_channel_operation(record.value)
        assert isinstance(parsed, ChannelOperation) and parsed.key.encode() == record.key
        assert list(validator.iter_errors(event)) == []


def test_publishing_a_channel_model_works_like_its_wire_form() -> None:
    pub = InMemoryPublisher()
    model = parse_channel_operation(
        orjson.dumps(
            {
                "schema": "prism.channel-operation/v1",
                "eventId": "e1",
                "operationId": "op-1",
                "seq": 0,
                "ts": "2026-11-30T12:00:00Z",
                "connectionId": "c",
                "kind": "notify",
                "state": "admitted",
            }
        )
    )
    pub.publish(model)
    assert pub.records[0].key == b"op-1" and pub.events[0]["kind"] == "notify"


def test_agent_helpers_ignore_channel_records_that_name_a_run() -> None:
    pub = InMemoryPublisher()
    run = pub.run("run-1")
    run.emit("agent_started", {})
    pub.channel("c", "op-1", run_id="run-1").emit("admitted")
    assert pub.types_of("run-1") == ["agent_started"]
    assert pub.run_ids() == ["run-1"]
    assert len(pub.agent_events) == 1 and len(pub.channel_events) == 1


def test_run_emitter_publishes_guardrail_denials() -> None:
    pub = InMemoryPublisher()
    run = pub.run("run-1", tenant_id="acme")
    run.emit("agent_started", {})
    run.guardrail_denied("pack:secrets-hygiene/no-secret-args", "before_tool", turn=2, tool="fetch")
    run.guardrail_denied("pack:coding-standard/no-test-rewrites", "output")
    with pytest.raises(InvalidEvent, match=r"data\.rule"):
        run.guardrail_denied("secrets-hygiene", "before_tool")
    with pytest.raises(InvalidEvent, match=r"data\.stage"):
        run.guardrail_denied("pack:a/b", "sometime")
    assert [(e["seq"], e["type"]) for e in pub.events] == [
        (0, "agent_started"),
        (1, "guardrail_denied"),
        (2, "guardrail_denied"),
    ]
    first = parse_event(pub.records[1].value)
    assert isinstance(first, GuardrailDenied)
    assert (first.data.turn, first.data.tool, first.data.stage) == (2, "fetch", "before_tool")
    assert pub.events[2]["data"] == {
        "rule": "pack:coding-standard/no-test-rewrites",
        "stage": "output",
    }


class _TopicSink:
    """Records what a buffered publisher hands over (the Kafka sink sends to ``record.topic``)."""

    def __init__(self) -> None:
        self.sent: list[Record] = []

    async def start(self) -> None:
        return None

    async def send(self, record: Record) -> asyncio.Future[Any]:
        self.sent.append(record)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut

    async def stop(self) -> None:
        return None


@pytest.mark.timeout(10)
async def test_the_buffered_publisher_hands_each_record_over_with_its_topic() -> None:
    sink = _TopicSink()
    pub = BufferedPublisher(sink, topic="acme.agent-events")
    pub.run("run-1").emit("agent_started", {})
    pub.channel("telegram:support", "op-1").emit("admitted")
    assert await pub.close(timeout=5) is True
    assert [(r.key, r.topic) for r in sink.sent] == [
        (b"run-1", "acme.agent-events"),
        (b"op-1", "acme.channel-operations"),
    ]
