"""A run's ledger rows -> the OpenTelemetry spans of its trace (pure: no I/O, no clock).

Follows the OpenTelemetry GenAI semantic conventions at ``SEMCONV_VERSION`` (all
``gen_ai.*`` names are Development status there); docs/TRACES.md has the whole mapping.

- the run: an ``invoke_agent {agent}`` span (INTERNAL), the trace's root, or a child of
  its parent run's ``invoke_agent`` span in the parent's trace;
- each provider turn attempt (``provider_turn_finished``): a ``chat {model}`` span
  (CLIENT) that ends at the event's time and lasts its ``latencyMs``, with the turn
  attempt's billable usage row (rule 5): reported tokens as ``gen_ai.usage.*`` and the
  billed cost (``gen_ai.usage.cost``, ``llm.cost.total``, ``prism.usage.cost``); estimated
  tokens only as ``prism.usage.estimated.*`` with their confidence and no cost (rule 6);
- each tool call (``tool_call_finished``): an ``execute_tool {tool}`` span (INTERNAL);
- every other event of the run: an event on the run's span (the terminal ``error`` as
  the conventional ``exception`` event), limit deaths and failures also as its status.

Ids derive from run and event ids only (``trace_id_of``, ``span_id_of``), so exporting
the same ledger again gives the same trace, span for span.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import orjson
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from prism.schemas import RawEventRow, RunRow, UsageRow

__all__ = [
    "SEMCONV_SCHEMA_URL",
    "SEMCONV_VERSION",
    "BilledCost",
    "RunFacts",
    "run_spans",
    "span_id_of",
    "trace_id_of",
    "trace_roots",
]

SEMCONV_VERSION = "1.44.0"
SEMCONV_SCHEMA_URL = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"
_SCOPE = InstrumentationScope("prism.pipeline.traces", schema_url=SEMCONV_SCHEMA_URL)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MAX_DEPTH = 64  # delegation levels followed up to a trace's root run

# Events that are spans of their own or folded into one (usage rows go to their turn,
# agent_started's limits to the run's span).
_SPAN_TYPES = frozenset({"provider_turn_finished", "tool_call_finished"})
_FOLDED_TYPES = frozenset({"usage_recorded", "agent_started"})
_SNAKE_RE = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")

Attrs = dict[str, Any]


@dataclass(frozen=True, slots=True)
class BilledCost:
    """What ``billing`` bills for one usage row: amount, currency and who priced it."""

    cost: Decimal
    currency: str | None
    priced_by: str  # runtime | price_book


@dataclass(frozen=True, slots=True)
class RunFacts:
    """One run as the ledger holds it: its record, accepted events (seq order), usage rows."""

    run: RunRow
    events: Sequence[RawEventRow]
    usage: Sequence[UsageRow]


def _digest(size: int, *parts: str) -> int:
    value = int.from_bytes(hashlib.sha256("\x1f".join(parts).encode()).digest()[:size], "big")
    return value or 1  # an all-zero id is invalid in OTLP


def trace_id_of(root_run_id: str) -> int:
    """The trace id of the delegation tree whose top run is ``root_run_id``."""
    return _digest(16, "prism.trace", root_run_id)


def span_id_of(run_id: str, event_id: str | None = None) -> int:
    """The span id of a run (``event_id`` None) or of one of its events."""
    return _digest(8, "prism.span", run_id, event_id or "")


def trace_roots(parents: Mapping[str, str | None], run_ids: Iterable[str]) -> dict[str, str]:
    """Each run's top ancestor: follow ``parents`` (run -> parent run) while it knows the run.

    A parent that ``parents`` does not hold (not in the ledger) is the root: its id is all
    the child knows, and the parent's own export later uses the same trace. A cycle (ids
    reused by hostile producers) stops at the run where it closes.
    """
    out = {}
    for run_id in run_ids:
        seen, current = {run_id}, run_id
        for _ in range(_MAX_DEPTH):
            parent = parents.get(current)
            if not parent or parent in seen:
                break
            seen.add(parent)
            current = parent
        out[run_id] = current
    return out


def _ns(value: datetime) -> int:
    value = value if value.tzinfo else value.replace(tzinfo=UTC)
    return (value - _EPOCH) // timedelta(microseconds=1) * 1000


def _snake(name: str) -> str:
    return _SNAKE_RE.sub("_", name).lower()


def _attr_value(value: Any) -> Any:
    """An OTel attribute value: scalars as they are, a list of strings, anything else JSON."""
    if isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return list(value)
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def _put(attrs: Attrs, key: str, value: Any) -> None:
    if value is not None:
        attrs[key] = value


def _context(trace_id: int, span_id: int) -> SpanContext:
    return SpanContext(trace_id, span_id, is_remote=False, trace_flags=TraceFlags(1))


def _producer_link(traceparent: str | None, event_id: str) -> list[Link]:
    """A link to the producer's span from a W3C ``traceparent`` (none when malformed)."""
    parts = (traceparent or "").strip().split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return []
    try:
        trace_id, span_id = int(parts[1], 16), int(parts[2], 16)
    except ValueError:
        return []
    if not trace_id or not span_id:
        return []
    ctx = SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(1))
    return [Link(ctx, {"prism.link": "producer", "prism.event.id": event_id})]


def _payload(event: RawEventRow) -> dict[str, Any]:
    try:
        data = orjson.loads(event.payload)
    except orjson.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


def _event_attrs(event: RawEventRow, data: Mapping[str, Any]) -> Attrs:
    attrs: Attrs = {"prism.event.id": event.event_id, "prism.event.seq": event.seq}
    for key, value in data.items():
        _put(attrs, f"prism.{_snake(key)}", _attr_value(value))
    return attrs


def run_spans(
    facts: RunFacts,
    root_run_id: str,
    resource: Resource,
    costs: Mapping[str, BilledCost] | None = None,
) -> list[ReadableSpan]:
    """The spans of one run, its ``invoke_agent`` span first.

    ``root_run_id``: the top of its delegation tree (``trace_roots``); ``costs``: the
    billed cost of usage rows by ``event_id`` (reported rows that ``billing`` priced).

    Example::

        spans = run_spans(RunFacts(run, events, usage), run.run_id, Resource({}))
        spans[0].name   # "invoke_agent research-assistant"
    """
    run = facts.run
    trace_id = trace_id_of(root_run_id)
    root_ctx = _context(trace_id, span_id_of(run.run_id))
    parent = _context(trace_id, span_id_of(run.parent_run_id)) if run.parent_run_id else None
    usage = _turn_usage(facts.usage)
    children: list[ReadableSpan] = []
    run_events: list[Event] = []
    first_link: list[Link] = []
    limits: Attrs = {}
    for event in facts.events:
        data = _payload(event)
        if not first_link:
            first_link = _producer_link(event.traceparent, event.event_id)
        if event.type == "agent_started":
            for key, value in (data.get("limits") or {}).items():
                _put(limits, f"prism.run.limits.{_snake(key)}", _attr_value(value))
        elif event.type == "provider_turn_finished":
            children.append(_chat_span(run, event, data, usage, costs or {}, root_ctx, resource))
        elif event.type == "tool_call_finished":
            children.append(_tool_span(run, event, data, root_ctx, resource))
        elif event.type not in _FOLDED_TYPES:
            run_events.append(_run_event(event, data))
    for row in usage.values():  # a turn whose provider_turn_finished the ledger lacks
        children.append(_usage_only_span(run, row, costs or {}, root_ctx, resource))
    start, end = _run_times(run, facts.events)
    status, attrs = _run_status(run)
    root = ReadableSpan(
        name=f"invoke_agent {run.agent_id}" if run.agent_id else "invoke_agent",
        context=root_ctx,
        parent=parent,
        resource=resource,
        attributes={**_run_attrs(run), **limits, **attrs},
        events=run_events,
        links=first_link,
        kind=SpanKind.INTERNAL,
        status=status,
        start_time=start,
        end_time=end,
        instrumentation_scope=_SCOPE,
    )
    return [root, *children]


def _run_times(run: RunRow, events: Sequence[RawEventRow]) -> tuple[int, int]:
    """Start: ``agent_started`` (else the first event); end: the terminal (else the last)."""
    first = min((e.ts for e in events), default=run.last_event_at)
    start = run.started_at or first
    end = run.finished_at or run.last_event_at
    return _ns(start), max(_ns(end), _ns(start))


def _run_attrs(run: RunRow) -> Attrs:
    attrs: Attrs = {"gen_ai.operation.name": "invoke_agent"}
    _put(attrs, "gen_ai.provider.name", run.provider)
    _put(attrs, "gen_ai.agent.id", run.agent_id)
    _put(attrs, "gen_ai.agent.name", run.agent_id)
    _put(attrs, "gen_ai.agent.version", run.agent_definition_revision)
    _put(attrs, "gen_ai.conversation.id", run.session_id)
    _put(attrs, "gen_ai.request.model", run.model)
    attrs["prism.run.id"] = run.run_id
    attrs["prism.run.status"] = run.status
    for name in ("tenant_id", "account_id", "user_id"):
        _put(attrs, f"prism.{name.removesuffix('_id')}.id", getattr(run, name))
    _put(attrs, "prism.bundle.digest", run.bundle_digest)
    _put(attrs, "prism.parent.run.id", run.parent_run_id)
    _put(attrs, "prism.delegation.id", run.delegation_id)
    _put(attrs, "prism.child.id", run.child_id)
    for name in ("stop_reason", "stop_detail", "finish_reason", "terminal_type"):
        _put(attrs, f"prism.run.{name}", getattr(run, name))
    attrs["prism.run.turns.model"] = run.model_turns
    attrs["prism.run.turns.deterministic"] = run.deterministic_turns
    attrs["prism.run.tool_calls"] = run.tool_calls
    attrs["prism.run.event_count"] = run.event_count
    attrs["prism.run.missing_count"] = run.missing_count
    _put(attrs, "prism.run.cache_hit_rate", run.cache_hit_rate)
    for name in ("limit", "maximum", "observed", "axis", "closest"):
        _put(attrs, f"prism.run.exhaustion.{name}", getattr(run, f"exhaustion_{name}"))
    if run.usage_mismatch:
        attrs["prism.run.usage_mismatch"] = True
    if run.clock_skew:
        attrs["prism.run.clock_skew"] = True
    return attrs


def _run_status(run: RunRow) -> tuple[Status, Attrs]:
    """ERROR for a run that failed, was aborted or denied (limit deaths included)."""
    if run.status == "failed":
        what = run.error_code or "error"
        if run.exhaustion_limit:
            what = f"{what} (limit {run.exhaustion_limit})"
        text = f"{what}: {run.error_message}" if run.error_message else what
        return Status(StatusCode.ERROR, text), {"error.type": run.error_code or "error"}
    if run.status == "aborted":
        text = f"aborted: {run.abort_reason}" if run.abort_reason else "aborted"
        return Status(StatusCode.ERROR, text), {"error.type": run.error_code or "aborted"}
    if run.status == "denied":
        text = f"denied: {run.denied_reason}" if run.denied_reason else "denied"
        return Status(StatusCode.ERROR, text), {"error.type": "denied"}
    return Status(StatusCode.UNSET), {}


def _run_event(event: RawEventRow, data: Mapping[str, Any]) -> Event:
    attrs = _event_attrs(event, data)
    if event.type == "error":  # the conventional exception event, beside Prism's facts
        error = data.get("error") or {}
        _put(attrs, "exception.type", error.get("code"))
        _put(attrs, "exception.message", error.get("message"))
        _put(attrs, "prism.failure_class", error.get("failureClass"))
        return Event("exception", attrs, _ns(event.ts))
    return Event(f"prism.{event.type}", attrs, _ns(event.ts))


def _turn_usage(rows: Iterable[UsageRow]) -> dict[tuple[int, int], UsageRow]:
    """The billable usage row of each turn attempt: reported wins, else the latest estimate."""
    out: dict[tuple[int, int], UsageRow] = {}
    for row in sorted(rows, key=lambda r: (not r.estimated, r.seq)):
        if row.scope == "provider_turn" and row.turn is not None and not row.superseded:
            out[(row.turn, row.attempt or 0)] = row
    return out


def _chat_span(
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
    _put(attrs, "gen_ai.provider.name", provider)
    _put(attrs, "gen_ai.request.model", model)
    _put(attrs, "gen_ai.conversation.id", run.session_id)
    stop = data.get("stopReason")
    if isinstance(stop, str):
        attrs["gen_ai.response.finish_reasons"] = [stop]
    attrs.update({"prism.run.id": run.run_id, "prism.event.id": event.event_id})
    attrs["prism.event.seq"] = event.seq
    _put(attrs, "prism.turn", turn)
    _put(attrs, "prism.turn.attempt", attempt)
    _put(attrs, "prism.turn.latency_ms", data.get("latencyMs"))
    for group in ("budgets", "tools", "cache"):
        for key, value in (data.get(group) or {}).items():
            _put(attrs, f"prism.turn.{group}.{_snake(key)}", _attr_value(value))
    key = (turn, attempt) if isinstance(turn, int) and isinstance(attempt, int) else None
    row = usage.pop(key, None) if key is not None else None
    if row is not None:
        attrs.update(_usage_attrs(row, costs.get(row.event_id)))
    status = Status(StatusCode.UNSET)
    if stop == "provider_error":
        status = Status(StatusCode.ERROR, "provider_error")
        attrs["error.type"] = "provider_error"
    end = _ns(event.ts)
    latency = data.get("latencyMs")
    start = end - int(latency * 1_000_000) if isinstance(latency, int | float) else end
    return ReadableSpan(
        name=f"chat {model}" if model else "chat",
        context=_context(root.trace_id, span_id_of(run.run_id, event.event_id)),
        parent=root,
        resource=resource,
        attributes=attrs,
        links=_producer_link(event.traceparent, event.event_id),
        kind=SpanKind.CLIENT,
        status=status,
        start_time=max(0, start),
        end_time=end,
        instrumentation_scope=_SCOPE,
    )


def _usage_only_span(
    run: RunRow,
    row: UsageRow,
    costs: Mapping[str, BilledCost],
    root: SpanContext,
    resource: Resource,
) -> ReadableSpan:
    """A turn attempt known only by its usage row: a ``chat`` span at the row's time."""
    model = row.model or run.model
    attrs: Attrs = {"gen_ai.operation.name": "chat"}
    _put(attrs, "gen_ai.provider.name", row.provider or run.provider)
    _put(attrs, "gen_ai.request.model", model)
    _put(attrs, "gen_ai.conversation.id", run.session_id)
    attrs.update({"prism.run.id": run.run_id, "prism.event.id": row.event_id})
    attrs["prism.event.seq"] = row.seq
    _put(attrs, "prism.turn", row.turn)
    _put(attrs, "prism.turn.attempt", row.attempt)
    attrs["prism.turn.event_missing"] = True
    attrs.update(_usage_attrs(row, costs.get(row.event_id)))
    at = _ns(row.recorded_at)
    return ReadableSpan(
        name=f"chat {model}" if model else "chat",
        context=_context(root.trace_id, span_id_of(run.run_id, row.event_id)),
        parent=root,
        resource=resource,
        attributes=attrs,
        kind=SpanKind.CLIENT,
        start_time=at,
        end_time=at,
        instrumentation_scope=_SCOPE,
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
        _put(attrs, "prism.usage.confidence", row.confidence)
        for column, name in _TOKENS:
            _put(attrs, f"prism.usage.estimated.{name}", getattr(row, column))
        return attrs
    attrs["prism.usage.source"] = "reported"
    for column, name in _TOKENS:
        _put(attrs, f"gen_ai.usage.{name}", getattr(row, column))
    if billed is not None:
        attrs["prism.usage.cost"] = str(billed.cost)
        _put(attrs, "prism.usage.currency", billed.currency)
        attrs["prism.usage.priced_by"] = billed.priced_by
        if billed.currency == "USD":  # the tools read a bare number as US dollars
            attrs["gen_ai.usage.cost"] = float(billed.cost)
            attrs["llm.cost.total"] = float(billed.cost)
    return attrs


def _tool_span(
    run: RunRow,
    event: RawEventRow,
    data: Mapping[str, Any],
    root: SpanContext,
    resource: Resource,
) -> ReadableSpan:
    tool = data.get("tool")
    attrs: Attrs = {"gen_ai.operation.name": "execute_tool"}
    _put(attrs, "gen_ai.tool.name", tool)
    attrs.update({"prism.run.id": run.run_id, "prism.event.id": event.event_id})
    attrs["prism.event.seq"] = event.seq
    _put(attrs, "prism.turn", data.get("turn"))
    _put(attrs, "prism.tool.call_id_hash", data.get("callIdHash"))
    _put(attrs, "prism.tool.duration_ms", data.get("durationMs"))
    _put(attrs, "prism.tool.ok", data.get("ok"))
    status = Status(StatusCode.UNSET)
    if data.get("ok") is False:
        code = data.get("errorCode") or "tool_error"
        status = Status(StatusCode.ERROR, str(code))
        attrs["error.type"] = str(code)
    end = _ns(event.ts)
    duration = data.get("durationMs")
    start = end - int(duration * 1_000_000) if isinstance(duration, int | float) else end
    return ReadableSpan(
        name=f"execute_tool {tool}" if tool else "execute_tool",
        context=_context(root.trace_id, span_id_of(run.run_id, event.event_id)),
        parent=root,
        resource=resource,
        attributes=attrs,
        links=_producer_link(event.traceparent, event.event_id),
        kind=SpanKind.INTERNAL,
        status=status,
        start_time=max(0, start),
        end_time=end,
        instrumentation_scope=_SCOPE,
    )
