"""InMemoryPublisher and what every publisher shares: records, headers, size and contract checks."""

from __future__ import annotations

from decimal import Decimal

import orjson
import pytest
from opentelemetry.sdk.trace import TracerProvider

from prism import runtime
from prism.runtime import (
    EventTooLarge,
    InMemoryPublisher,
    InvalidEvent,
    PublisherClosed,
    PublisherError,
)
from prism.schemas import parse_event


def envelope(run_id: str = "run-1", seq: int = 0, **extra: object) -> dict[str, object]:
    return {
        "schema": "prism.agent-event/v1",
        "eventId": f"{run_id}-e{seq}",
        "runId": run_id,
        "seq": seq,
        "type": "agent_started",
        "ts": "2026-11-30T12:00:00.000000+00:00",
        "data": {},
        **extra,
    }


def test_public_names_are_exactly_the_documented_surface() -> None:
    assert set(runtime.__all__) == {
        "DEFAULT_CHANNEL_TOPIC", "DEFAULT_LINGER_MS", "DEFAULT_MAX_BATCH_SIZE", "DEFAULT_TOPIC",
        "ChannelEmitter", "DeliveryFailed", "EventPublisher", "EventTooLarge", "FullPolicy",
        "InMemoryPublisher", "InvalidEvent", "PublishResult", "PublisherClosed",
        "PublisherError", "PublisherStats", "Record", "RunEmitter", "channel_topic_for",
        "new_event_id", "utc_now_rfc3339", "FsyncPolicy", "SpoolError",
        "BudgetGuard", "Decision", "DEFAULT_BUDGET_TOPIC",
    }  # fmt: skip
    for name in runtime.__all__:
        assert getattr(runtime, name) is not None
    for exc in (
        EventTooLarge, InvalidEvent, PublisherClosed, runtime.DeliveryFailed, runtime.SpoolError
    ):  # fmt: skip
        assert issubclass(exc, PublisherError)


def test_records_are_keyed_by_run_id_with_json_value_and_content_type() -> None:
    pub = InMemoryPublisher()
    result = pub.publish(envelope("run-7", extra_field="ignored by consumers"))
    assert result.accepted is True
    (record,) = pub.records
    assert record.key == b"run-7"
    assert orjson.loads(record.value) == envelope("run-7", extra_field="ignored by consumers")
    assert dict(record.headers) == {"content-type": b"application/json"}
    assert pub.events == [orjson.loads(record.value)]
    assert pub.stats.published == pub.stats.delivered == 1


async def test_awaiting_a_publish_result_gives_whether_it_was_buffered() -> None:
    pub = InMemoryPublisher()
    assert await pub.run("run-1").emit("agent_started", {}) is True


def test_traceparent_header_comes_from_the_current_span() -> None:
    tracer = TracerProvider().get_tracer("runtime-tests")  # a local provider, not the global one
    pub = InMemoryPublisher()
    run = pub.run("run-1")
    with tracer.start_as_current_span("agent-turn") as span:
        traced = run.emit("agent_started", {}).event["eventId"]
    untraced = run.emit("agent_finished", {}).event["eventId"]
    ctx = span.get_span_context()
    assert pub.headers_of(traced)["traceparent"] == (
        f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}".encode()
    )
    assert "traceparent" not in pub.headers_of(untraced)


def test_oversize_event_is_rejected_naming_event_run_type_and_sizes() -> None:
    pub = InMemoryPublisher(max_event_bytes=1024)
    big = envelope("run-big", type="agent_denied", data={"reason": "x" * 2000})
    with pytest.raises(EventTooLarge) as info:
        pub.publish(big)
    message = str(info.value)
    size = len(orjson.dumps(big))
    for part in ("run-big-e0", "run-big", "agent_denied", f"{size} bytes", "1024-byte limit"):
        assert part in message
    assert (info.value.size, info.value.limit) == (size, 1024)
    assert pub.records == [] and pub.stats.rejected_oversize == 1


def test_prebuilt_envelopes_are_checked_against_the_contract() -> None:
    pub = InMemoryPublisher()
    with pytest.raises(InvalidEvent, match="seq"):
        pub.publish(envelope(seq=-1))
    with pytest.raises(InvalidEvent, match="runId"):
        InMemoryPublisher(validate=False).publish({**envelope(), "runId": None})
    assert pub.stats.rejected_invalid == 1


def test_parsed_event_models_publish_as_their_wire_form() -> None:
    value = orjson.dumps(envelope(type="usage_recorded", data={
        "scope": "run_total", "usage": {"inputTokens": 10, "cost": "0.0021", "currency": "USD"},
    }))  # fmt: skip
    pub = InMemoryPublisher()
    pub.publish(parse_event(value))
    assert pub.events[0]["data"]["usage"]["cost"] == "0.0021"
    assert parse_event(pub.records[0].value) == parse_event(value)


def test_decimal_cost_is_written_as_a_decimal_string() -> None:
    pub = InMemoryPublisher()
    usage = {"inputTokens": 10, "cost": Decimal("0.10"), "currency": "USD"}
    pub.run("run-1").emit("usage_recorded", {"scope": "run_total", "usage": usage})
    assert pub.events[0]["data"]["usage"]["cost"] == "0.10"


async def test_publish_after_close_raises_and_collected_events_stay() -> None:
    async with InMemoryPublisher() as pub:
        pub.run("run-1").emit("agent_started", {})
        assert await pub.flush() is True
    with pytest.raises(PublisherClosed):
        pub.publish(envelope())
    assert pub.run_ids() == ["run-1"]
    assert pub.types_of("run-1") == ["agent_started"]


def test_clear_forgets_events_but_keeps_counting() -> None:
    pub = InMemoryPublisher()
    pub.publish(envelope())
    pub.clear()
    pub.publish(envelope(seq=1))
    assert [e["seq"] for e in pub.events] == [1]
    assert pub.stats.published == 2
