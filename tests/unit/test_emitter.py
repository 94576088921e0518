"""RunEmitter: seq, eventId (UUIDv7), ts and envelope fields come out right and cannot be faked."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest

from prism.runtime import EventTooLarge, InMemoryPublisher, InvalidEvent, new_event_id
from prism.schemas import AgentFinishedData, parse_event

DIGEST = "sha256:" + "ab" * 32
MODEL = {"provider": "anthropic", "model": "claude-sonnet-4"}
TS_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}\+00:00$")


def turn_data(turn: int) -> dict[str, object]:
    return {
        "turn": turn,
        "attempt": 1,
        "latencyMs": 840,
        "stopReason": "tool_calls",
        "budgets": {"runInputUsed": 1200 * turn, "turns": turn, "maxTurns": 8},
        "tools": {"count": 3, "idsHash": "h3"},
        "usage": {"inputTokens": 1200, "outputTokens": 80},
    }


def test_seq_counts_from_zero_per_run_and_runs_do_not_share_it() -> None:
    pub = InMemoryPublisher()
    a, b = pub.run("run-a"), pub.run("run-b")
    a.emit("agent_started", {})
    b.emit("agent_started", {})
    a.emit("provider_turn_finished", turn_data(1))
    a.emit("agent_finished", {})
    b.emit("agent_finished", {})
    assert [e["seq"] for e in pub.events_of("run-a")] == [0, 1, 2]
    assert [e["seq"] for e in pub.events_of("run-b")] == [0, 1]
    assert a.next_seq == 3


def test_rejected_events_use_up_no_seq() -> None:
    pub = InMemoryPublisher(max_event_bytes=2048)
    run = pub.run("run-1")
    run.emit("agent_started", {})
    with pytest.raises(InvalidEvent):
        run.emit("agent_finished", {"stopReason": "because"})
    with pytest.raises(EventTooLarge):
        run.emit("agent_denied", {"reason": "x" * 4096})
    run.emit("agent_finished", {})
    assert [(e["seq"], e["type"]) for e in pub.events] == [
        (0, "agent_started"),
        (1, "agent_finished"),
    ]


def test_first_seq_resumes_a_run_where_it_left_off() -> None:
    pub = InMemoryPublisher()
    pub.run("run-1", first_seq=7).emit("run_resumed", {})
    assert pub.events[0]["seq"] == 7


def test_event_ids_are_uuid7_unique_and_increasing_in_emission_order() -> None:
    pub = InMemoryPublisher()
    run = pub.run("run-1")
    for i in range(300):
        run.emit("tool_call_finished", {"turn": 1, "tool": "search", "callIdHash": f"c{i}",
                                        "durationMs": 3, "ok": True})  # fmt: skip
    ids = [e["eventId"] for e in pub.events] + [new_event_id() for _ in range(20_000)]
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)  # time-ordered as strings, also within one millisecond
    parsed = [uuid.UUID(i) for i in ids[:50]]
    assert {u.version for u in parsed} == {7}
    assert {u.variant for u in parsed} == {uuid.RFC_4122}


def test_event_id_carries_the_emission_millisecond() -> None:
    before = datetime.now(UTC)
    event_id = new_event_id()
    after = datetime.now(UTC)
    ms = int(event_id.replace("-", "")[:12], 16)
    stamp = datetime.fromtimestamp(ms / 1000, UTC)
    assert before - timedelta(milliseconds=1) <= stamp <= after


def test_ts_is_rfc3339_utc_with_offset_and_microseconds() -> None:
    pub = InMemoryPublisher()
    before = datetime.now(UTC)
    pub.run("run-1").emit("agent_started", {})
    after = datetime.now(UTC)
    ts = pub.events[0]["ts"]
    assert TS_RE.match(ts), ts
    assert before <= datetime.fromisoformat(ts) <= after


def test_explicit_ts_is_normalised_to_utc_and_naive_times_are_refused() -> None:
    pub = InMemoryPublisher()
    run = pub.run("run-1")
    run.emit(
        "agent_started", {}, ts=datetime(2026, 1, 2, 14, 0, tzinfo=timezone(timedelta(hours=2)))
    )
    assert pub.events[0]["ts"] == "2026-01-02T12:00:00.000000+00:00"
    with pytest.raises(ValueError, match="no timezone"):
        run.emit("agent_finished", {}, ts=datetime(2026, 1, 2, 12, 0))
    assert run.next_seq == 1


def test_envelope_fields_are_filled_and_parse_back_into_the_contract() -> None:
    pub = InMemoryPublisher()
    run = pub.run(
        "run-1", tenant_id="acme", account_id="acct-9", user_id="u-1", session_id="s-1",
        agent="support-bot", model=MODEL, bundle_digest=DIGEST,
    )  # fmt: skip
    run.emit("provider_turn_finished", turn_data(1))
    event = pub.events[0]
    assert event["schema"] == "prism.agent-event/v1"
    assert (event["runId"], event["type"], event["tenantId"]) == (
        "run-1",
        "provider_turn_finished",
        "acme",
    )
    assert (event["accountId"], event["userId"], event["sessionId"]) == ("acct-9", "u-1", "s-1")
    assert event["agent"] == {"id": "support-bot"}
    assert event["model"] == MODEL
    assert event["bundleDigest"] == DIGEST
    assert event["data"] == turn_data(1)
    assert "parent" not in event
    parsed = parse_event(pub.records[0].value)
    assert parsed.tenant_id == "acme" and parsed.model is not None
    assert parsed.model.model == "claude-sonnet-4"


def test_child_emitter_sets_parent_and_inherits_ownership() -> None:
    pub = InMemoryPublisher()
    parent = pub.run("run-p", tenant_id="acme", model=MODEL, bundle_digest=DIGEST)
    child = parent.child(
        "run-c", delegation_id="d-1", child_id="c-1", model={"provider": "openai", "model": "gpt-5"}
    )
    child.emit("agent_started", {})
    event = pub.events_of("run-c")[0]
    assert event["parent"] == {"runId": "run-p", "delegationId": "d-1", "childId": "c-1"}
    assert event["tenantId"] == "acme" and event["bundleDigest"] == DIGEST
    assert event["model"] == {"provider": "openai", "model": "gpt-5"}
    assert event["seq"] == 0


def test_invalid_event_names_the_contract_reason() -> None:
    pub = InMemoryPublisher()
    run = pub.run("run-1", bundle_digest="md5:abc")
    with pytest.raises(InvalidEvent) as info:
        run.emit("agent_started", {})
    assert "bundleDigest" in info.value.reason
    assert info.value.run_id == "run-1" and info.value.type == "agent_started"
    assert pub.events == [] and pub.stats.rejected_invalid == 1


def test_payload_models_are_accepted_as_data() -> None:
    pub = InMemoryPublisher()
    pub.run("run-1").emit("agent_finished", AgentFinishedData(stop_reason="turn_limit"))
    assert pub.events[0]["data"] == {"stopReason": "turn_limit"}


def test_unknown_types_pass_for_forward_compatibility() -> None:
    pub = InMemoryPublisher()
    pub.run("run-1").emit("memory_compacted", {"entries": 3})
    assert pub.events[0]["type"] == "memory_compacted"


def test_run_id_must_be_a_non_empty_string() -> None:
    with pytest.raises(ValueError, match="run_id"):
        InMemoryPublisher().run("")
