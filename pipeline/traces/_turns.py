"""The spans under a run's: ``chat`` per provider turn attempt, ``execute_tool`` per tool call.

A turn attempt's tokens come from its billable usage row (``provider_turn``, rule 5): reported
usage as ``gen_ai.usage.*`` with the cost ``billing`` bills for it; an estimate only as
``prism.usage.estimated.*`` with its confidence, never priced (rule 6), so no tool shows it
as reported usage.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode

from prism.schemas import RawEventRow, RunRow, UsageRow

from ._otel import SCOPE, Attrs, attr_value, context, nanos, producer_link, put, snake, span_id_of

__all__ = ["BilledCost", "chat_span", "tool_span", "turn_usage", "usage_only_span"]


@dataclass(frozen=True, slots=True)
class BilledCost:
    """What ``billing`` bills for one usage row: amount, currency and who priced it."""

    cost: Decimal
    currency: str | None
    priced_by: str  # runtime | price_book


def turn_usage(rows: Iterable[UsageRow]) -> dict[tuple[int, int], UsageRow]:
    """The billable usage row of each turn attempt: reported wins, else the latest estimate."""
    out: dict[tuple[int, int], UsageRow] = {}
    for row in sorted(rows, key=lambda r: (not r.estimated, r.seq)):
        if row.scope == "provider_turn" and row.turn is not None and not row.superseded:
            out[(row.turn, row.attempt or 0)] = row
    return out


def chat_span(
    run: RunRow,
    event: RawEventRow,
    data: Mapping[str, Any],
    usage: dict[tuple[int, int], UsageRow],
    costs: Mapping[str, BilledCost],
    root: SpanContext,
    resource: Resource,
) -> ReadableSpan:
    model = event.model or run.model
    provider = event.provider or run.provider
    turn, attempt = data.get("turn"), data.get("attempt")
    attrs: Attrs = {"gen_ai.operation.name": "chat"}
    put(attrs, "gen_ai.provider.name", provider)
    put(attrs, "gen_ai.request.model", model)
    put(attrs, "gen_ai.conversation.id", run.session_id)
    stop = data.get("stopReason")
    if isinstance(stop, str):
        attrs["gen_ai.response.finish_reasons"] = [stop]
    attrs.update({"prism.run.id": run.run_id, "prism.event.id": event.event_id})
    attrs["prism.event.seq"] = event.seq
    put(attrs, "prism.turn", turn)
    put(attrs, "prism.turn.attempt", attempt)
    put(attrs, "prism.turn.latency_ms", data.get("latencyMs"))
    for group in ("budgets", "tools", "cache"):
        for key, value in (data.get(group) or {}).items():
            put(attrs, f"prism.turn.{group}.{snake(key)}", attr_value(value))
    key = (turn, attempt) if isinstance(turn, int) and isinstance(attempt, int) else None
    row = usage.pop(key, None) if key is not None else None
    if row is not None:
        attrs.update(_usage_attrs(row, costs.get(row.event_id)))
    status = Status(StatusCode.UNSET)
    if stop == "provider_error":
        status = Status(StatusCode.ERROR, "provider_error")
        attrs["error.type"] = "provider_error"
    end = nanos(event.ts)
    latency = data.get("latencyMs")
    start = end - int(latency * 1_000_000) if isinstance(latency, int | float) else end
    return ReadableSpan(
        name=f"chat {model}" if model else "chat",
        context=context(root.trace_id, span_id_of(run.run_id, event.event_id)),
        parent=root,
        resource=resource,
        attributes=attrs,
        links=producer_link(event.traceparent, event.event_id),
        kind=SpanKind.CLIENT,
        status=status,
        start_time=max(0, start),
        end_time=end,
        instrumentation_scope=SCOPE,
    )


def usage_only_span(
    run: RunRow,
    row: UsageRow,
    costs: Mapping[str, BilledCost],
    root: SpanContext,
    resource: Resource,
) -> ReadableSpan:
    """A turn attempt known only by its usage row: a ``chat`` span at the row's time."""
    model = row.model or run.model
    attrs: Attrs = {"gen_ai.operation.name": "chat"}
    put(attrs, "gen_ai.provider.name", row.provider or run.provider)
    put(attrs, "gen_ai.request.model", model)
    put(attrs, "gen_ai.conversation.id", run.session_id)
    attrs.update({"prism.run.id": run.run_id, "prism.event.id": row.event_id})
    attrs["prism.event.seq"] = row.seq
    put(attrs, "prism.turn", row.turn)
    put(attrs, "prism.turn.attempt", row.attempt)
    attrs["prism.turn.event_missing"] = True
    attrs.update(_usage_attrs(row, costs.get(row.event_id)))
    at = nanos(row.recorded_at)
    return ReadableSpan(
        name=f"chat {model}" if model else "chat",
        context=context(root.trace_id, span_id_of(run.run_id, row.event_id)),
        parent=root,
        resource=resource,
        attributes=attrs,
        kind=SpanKind.CLIENT,
        start_time=at,
        end_time=at,
        instrumentation_scope=SCOPE,
    )


_TOKENS = (
    ("input_tokens", "input_tokens"),
    ("output_tokens", "output_tokens"),
    ("cache_read_tokens", "cache_read.input_tokens"),
    ("cache_write_tokens", "cache_creation.input_tokens"),
)


def _usage_attrs(row: UsageRow, billed: BilledCost | None) -> Attrs:
    """Reported usage as ``gen_ai.usage.*`` with its billed cost; an estimate apart, unpriced."""
    attrs: Attrs = {"prism.usage.event.id": row.event_id}
    if row.estimated:
        attrs["prism.usage.source"] = "estimated"
        put(attrs, "prism.usage.confidence", row.confidence)
        for column, name in _TOKENS:
            put(attrs, f"prism.usage.estimated.{name}", getattr(row, column))
        return attrs
    attrs["prism.usage.source"] = "reported"
    for column, name in _TOKENS:
        put(attrs, f"gen_ai.usage.{name}", getattr(row, column))
    if billed is not None:
        attrs["prism.usage.cost"] = str(billed.cost)
        put(attrs, "prism.usage.currency", billed.currency)
        attrs["prism.usage.priced_by"] = billed.priced_by
        if billed.currency == "USD":  # the tools read a bare number as US dollars
            attrs["gen_ai.usage.cost"] = float(billed.cost)
            attrs["llm.cost.total"] = float(billed.cost)
    return attrs


def tool_span(
    run: RunRow,
    event: RawEventRow,
    data: Mapping[str, Any],
    root: SpanContext,
    resource: Resource,
) -> ReadableSpan:
    tool = data.get("tool")
    attrs: Attrs = {"gen_ai.operation.name": "execute_tool"}
    put(attrs, "gen_ai.tool.name", tool)
    attrs.update({"prism.run.id": run.run_id, "prism.event.id": event.event_id})
    attrs["prism.event.seq"] = event.seq
    put(attrs, "prism.turn", data.get("turn"))
    put(attrs, "prism.tool.call_id_hash", data.get("callIdHash"))
    put(attrs, "prism.tool.duration_ms", data.get("durationMs"))
    put(attrs, "prism.tool.ok", data.get("ok"))
    status = Status(StatusCode.UNSET)
    if data.get("ok") is False:
        code = data.get("errorCode") or "tool_error"
        status = Status(StatusCode.ERROR, str(code))
        attrs["error.type"] = str(code)
    end = nanos(event.ts)
    duration = data.get("durationMs")
    start = end - int(duration * 1_000_000) if isinstance(duration, int | float) else end
    return ReadableSpan(
        name=f"execute_tool {tool}" if tool else "execute_tool",
        context=context(root.trace_id, span_id_of(run.run_id, event.event_id)),
        parent=root,
        resource=resource,
        attributes=attrs,
        links=producer_link(event.traceparent, event.event_id),
        kind=SpanKind.INTERNAL,
        status=status,
        start_time=max(0, start),
        end_time=end,
        instrumentation_scope=SCOPE,
    )
