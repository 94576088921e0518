"""EventPublisher against the real broker: a multi-run fleet comes back exactly, in seq order.

The fleet covers several tenants and models, tool calls, cache usage, a limit death, a
denial, a provider error, a delegation with a failing child and one event close to the
1 MiB limit (larger than a producer batch); half of the runs are emitted inside
OpenTelemetry spans (from a local SDK provider, never the global one).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from prism.runtime import EventPublisher, RunEmitter

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

Step = tuple[str, dict[str, Any]]
TENANTS = ("acme", "globex", "initech")
MODELS = (
    {"provider": "anthropic", "model": "claude-sonnet-4"},
    {"provider": "openai", "model": "gpt-5"},
    {"provider": "local", "model": "llama-3-70b"},
)


def turn(n: int, stop: str = "tool_calls", cached: int | None = None) -> Step:
    usage: dict[str, Any] = {"inputTokens": 1500 * n, "outputTokens": 120, "cost": "0.0042",
                             "currency": "USD"}  # fmt: skip
    data: dict[str, Any] = {
        "turn": n, "attempt": 1, "latencyMs": 700 + n, "stopReason": stop,
        "budgets": {"runInputUsed": 1500 * n, "turns": n, "maxTurns": 6},
        "tools": {"count": 4, "idsHash": "t4"}, "usage": usage,
    }  # fmt: skip
    if cached is not None:
        data["cache"] = {"cacheReadTokens": cached, "cacheWriteTokens": 0}
    return "provider_turn_finished", data


def tool(n: int, name: str, ok: bool = True) -> Step:
    data: dict[str, Any] = {"turn": n, "tool": name, "callIdHash": f"{name}-{n}",
                            "durationMs": 35, "ok": ok}  # fmt: skip
    if not ok:
        data["errorCode"] = "timeout"
    return "tool_call_finished", data


def usage_row(n: int) -> Step:
    return "usage_recorded", {"scope": "provider_turn", "turn": n, "attempt": 1,
                              "usage": {"inputTokens": 1500 * n, "outputTokens": 120}}  # fmt: skip


def happy(turns: int) -> list[Step]:
    steps: list[Step] = [("agent_started", {"idempotencyKey": "k"})]
    for n in range(1, turns + 1):
        steps += [turn(n, cached=300 * (n - 1) or None), usage_row(n), tool(n, "search")]
    steps.append(turn(turns + 1, stop="end_turn"))
    steps.append(("deterministic_turn_finished", {"turn": turns + 2, "middleware": "cache.reply"}))
    return [*steps, ("agent_finished", {"finishReason": "stop"})]


def limit_death() -> list[Step]:
    return [
        ("agent_started", {}), turn(1), tool(1, "fetch", ok=False), turn(2),
        ("run_limit_exceeded", {"limit": "maxTurns", "maximum": 2, "observed": 3}),
        ("budget_exhausted", {"axis": "maxTurns", "counters": {"turns": 3},
                              "closest": [{"axis": "maxTurns", "used": 3, "maximum": 2}],
                              "lastToolCallHashes": ["fetch-1"]}),
        ("error", {"error": {"code": "run_limit", "message": "turn limit reached",
                             "failureClass": "permanent"}}),
    ]  # fmt: skip


def provider_error() -> list[Step]:
    return [
        ("agent_started", {}),
        (
            "error",
            {
                "error": {
                    "code": "rate_limited",
                    "message": "429 from provider",
                    "failureClass": "rate_limited",
                }
            },
        ),
    ]


def fleet(pub: EventPublisher) -> dict[RunEmitter, list[Step]]:
    """Twelve top-level runs plus delegated children and one with a ~900 KB event."""
    big = pub.run("run-big", tenant_id="acme", model=MODELS[0])
    runs: dict[RunEmitter, list[Step]] = {
        big: [("agent_started", {}), ("workspace_snapshot", {"manifest": "x" * 900_000}),
              ("agent_finished", {})],
    }  # fmt: skip
    for i in range(12):
        run = pub.run(f"run-{i:02d}", tenant_id=TENANTS[i % 3], model=MODELS[i % 3],
                      agent="support-bot", session_id=f"s-{i}",
                      bundle_digest="sha256:" + f"{i:02x}" * 32)  # fmt: skip
        kind = i % 4
        if kind == 0:
            runs[run] = happy(turns=2 + i % 3)
        elif kind == 1:
            runs[run] = limit_death()
        elif kind == 2:
            runs[run] = provider_error() if i % 8 == 2 else [("agent_denied", {"reason": "policy"})]
        else:
            child = run.child(f"run-{i:02d}-c1", delegation_id=f"d-{i}", child_id="c1")
            runs[child] = limit_death()
            runs[run] = [
                ("agent_started", {}), turn(1),
                ("child_milestone", {"delegationId": f"d-{i}", "childId": "c1",
                                     "childRunId": child.run_id, "turn": 1}),
                ("child_failed", {"delegationId": f"d-{i}", "childId": "c1",
                                  "childRunId": child.run_id,
                                  "error": {"code": "run_limit", "message": "child hit maxTurns"},
                                  "breach": {"limit": "maxTurns", "maximum": 2, "observed": 3}}),
                ("delegation_child_events_capped", {"delegationId": f"d-{i}", "cap": 50}),
                turn(2, stop="end_turn"), ("agent_finished", {}),
            ]  # fmt: skip
    return runs


async def consume(bootstrap: str, topic: str, count: int) -> list[Any]:
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
        enable_auto_commit=False, group_id=None,
    )  # fmt: skip
    await consumer.start()
    records: list[Any] = []
    try:
        while len(records) < count:
            batches = await consumer.getmany(timeout_ms=1000)
            for batch in batches.values():
                records.extend(batch)
        await asyncio.sleep(0.5)  # anything extra (a duplicate) would arrive now
        for batch in (await consumer.getmany(timeout_ms=500)).values():
            records.extend(batch)
    finally:
        await consumer.stop()
    return records


async def test_a_fleet_comes_back_exactly_in_per_run_seq_order_with_traceparent(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    topic = f"{topic_prefix}.agent-events"
    tracer = TracerProvider().get_tracer("publisher-it")
    pub = EventPublisher(kafka_bootstrap, topic=topic, raise_errors=True)
    runs = fleet(pub)
    spans = {run.run_id: tracer.start_span(f"agent {run.run_id}") for run in list(runs)[::2]}
    published: list[dict[str, Any]] = []
    queues = {run: iter(steps) for run, steps in runs.items()}
    while queues:  # runs interleave, as in a live fleet
        for run, steps_left in list(queues.items()):
            step = next(steps_left, None)
            if step is None:
                del queues[run]
                continue
            span = spans.get(run.run_id)
            with trace.use_span(span, end_on_exit=False) if span else contextlib.nullcontext():
                result = run.emit(*step)
            assert await result is True
            published.append(dict(result.event))
    assert await pub.close(timeout=30) is True

    records = await consume(kafka_bootstrap, topic, len(published))

    stats = pub.stats
    assert (stats.published, stats.delivered, stats.dropped_full) == (
        len(published),
        len(published),
        0,
    )
    got = [orjson.loads(r.value) for r in records]
    assert sorted(got, key=lambda e: e["eventId"]) == sorted(published, key=lambda e: e["eventId"])
    by_run: dict[str, list[int]] = defaultdict(list)
    for record, event in zip(records, got, strict=True):
        assert record.key == event["runId"].encode()
        by_run[event["runId"]].append(event["seq"])
        headers = dict(record.headers)
        assert headers["content-type"] == b"application/json"
        span = spans.get(event["runId"])
        if span is None:
            assert "traceparent" not in headers
        else:
            ctx = span.get_span_context()
            assert headers["traceparent"].decode().split("-")[1:3] == [
                f"{ctx.trace_id:032x}",
                f"{ctx.span_id:016x}",
            ]
    assert {run.run_id for run in runs} == set(by_run)
    for run, steps in runs.items():
        assert by_run[run.run_id] == list(range(len(steps))), run.run_id


async def test_channel_operations_reach_their_own_topic_keyed_by_operation(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    topic = f"{topic_prefix}.agent-events"
    pub = EventPublisher(kafka_bootstrap, topic=topic, raise_errors=True)
    assert pub.channel_topic == f"{topic_prefix}.channel-operations"
    run = pub.run("run-ch", tenant_id="acme")
    run.emit("agent_started", {})
    run.guardrail_denied("pack:destructive-commands/no-force-push", "before_tool", turn=1)
    sent = []
    for n in range(3):
        op = pub.channel("telegram:support", f"op-{n}", tenant_id="acme", run_id="run-ch")
        for state in ("admitted", "executing", "delivery_unknown" if n == 1 else "delivered"):
            sent.append(dict(op.emit(state).event))
    sent.append(dict(pub.deny("telegram:support", "capacity", tenant_id="acme").event))
    assert await pub.close(timeout=30) is True

    channel = await consume(kafka_bootstrap, pub.channel_topic, len(sent))
    agent = await consume(kafka_bootstrap, topic, 2)
    assert [orjson.loads(r.value)["type"] for r in agent] == ["agent_started", "guardrail_denied"]
    got = [orjson.loads(r.value) for r in channel]
    assert sorted(got, key=lambda e: e["eventId"]) == sorted(sent, key=lambda e: e["eventId"])
    by_key: dict[bytes, list[tuple[int, str]]] = defaultdict(list)
    for record, event in zip(channel, got, strict=True):
        by_key[record.key].append((event["seq"], event["state"]))
    assert by_key[b"op-1"] == [(0, "admitted"), (1, "executing"), (2, "delivery_unknown")]
    assert by_key[b"telegram:support"] == [(0, "denied")]
