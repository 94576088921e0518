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

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from prism.schemas import RawEventRow, RunRow, UsageRow

from ._otel import (
    SCOPE,
    SEMCONV_SCHEMA_URL,
    SEMCONV_VERSION,
    Attrs,
    attr_value,
    context,
    nanos,
    producer_link,
    put,
    snake,
    span_id_of,
    trace_id_of,
)
from ._turns import BilledCost, chat_span, tool_span, turn_usage, usage_only_span

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

_MAX_DEPTH = 64  # delegation levels followed up to a trace's root run
# Events folded into a span rather than kept as events (usage rows go to their turn,
# agent_started's limits to the run's span).
_FOLDED_TYPES = frozenset({"usage_recorded", "agent_started"})


@dataclass(frozen=True, slots=True)
class RunFacts:
    """One run as the ledger holds it: its record, accepted events (seq order), usage rows."""

    run: RunRow
    events: Sequence[RawEventRow]
    usage: Sequence[UsageRow]


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


def _payload(event: RawEventRow) -> dict[str, Any]:
    try:
        data = orjson.loads(event.payload)
    except orjson.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


def _event_attrs(event: RawEventRow, data: Mapping[str, Any]) -> Attrs:
    attrs: Attrs = {"prism.event.id": event.event_id, "prism.event.seq": event.seq}
    for key, value in data.items():
        put(attrs, f"prism.{snake(key)}", attr_value(value))
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
    root_ctx = context(trace_id, span_id_of(run.run_id))
    parent = context(trace_id, span_id_of(run.parent_run_id)) if run.parent_run_id else None
    usage = turn_usage(facts.usage)
    children: list[ReadableSpan] = []
    run_events: list[Event] = []
    first_link: list[Link] = []
    limits: Attrs = {}
    for event in facts.events:
        data = _payload(event)
        if not first_link:
            first_link = producer_link(event.traceparent, event.event_id)
        if event.type == "agent_started":
            for key, value in (data.get("limits") or {}).items():
                put(limits, f"prism.run.limits.{snake(key)}", attr_value(value))
        elif event.type == "provider_turn_finished":
            children.append(chat_span(run, event, data, usage, costs or {}, root_ctx, resource))
        elif event.type == "tool_call_finished":
            children.append(tool_span(run, event, data, root_ctx, resource))
        elif event.type not in _FOLDED_TYPES:
            run_events.append(_run_event(event, data))
    for row in usage.values():  # a turn whose provider_turn_finished the ledger lacks
        children.append(usage_only_span(run, row, costs or {}, root_ctx, resource))
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
        instrumentation_scope=SCOPE,
    )
    return [root, *children]


def _run_times(run: RunRow, events: Sequence[RawEventRow]) -> tuple[int, int]:
    """Start: ``agent_started`` (else the first event); end: the terminal (else the last)."""
    first = min((e.ts for e in events), default=run.last_event_at)
    start = run.started_at or first
    end = run.finished_at or run.last_event_at
    return nanos(start), max(nanos(end), nanos(start))


def _run_attrs(run: RunRow) -> Attrs:
    attrs: Attrs = {"gen_ai.operation.name": "invoke_agent"}
    put(attrs, "gen_ai.provider.name", run.provider)
    put(attrs, "gen_ai.agent.id", run.agent_id)
    put(attrs, "gen_ai.agent.name", run.agent_id)
    put(attrs, "gen_ai.agent.version", run.agent_definition_revision)
    put(attrs, "gen_ai.conversation.id", run.session_id)
    put(attrs, "gen_ai.request.model", run.model)
    attrs["prism.run.id"] = run.run_id
    attrs["prism.run.status"] = run.status
    for name in ("tenant_id", "account_id", "user_id"):
        put(attrs, f"prism.{name.removesuffix('_id')}.id", getattr(run, name))
    put(attrs, "prism.bundle.digest", run.bundle_digest)
    put(attrs, "prism.parent.run.id", run.parent_run_id)
    put(attrs, "prism.delegation.id", run.delegation_id)
    put(attrs, "prism.child.id", run.child_id)
    for name in ("stop_reason", "stop_detail", "finish_reason", "terminal_type"):
        put(attrs, f"prism.run.{name}", getattr(run, name))
    attrs["prism.run.turns.model"] = run.model_turns
    attrs["prism.run.turns.deterministic"] = run.deterministic_turns
    attrs["prism.run.tool_calls"] = run.tool_calls
    attrs["prism.run.event_count"] = run.event_count
    attrs["prism.run.missing_count"] = run.missing_count
    put(attrs, "prism.run.cache_hit_rate", run.cache_hit_rate)
    for name in ("limit", "maximum", "observed", "axis", "closest"):
        put(attrs, f"prism.run.exhaustion.{name}", getattr(run, f"exhaustion_{name}"))
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
        put(attrs, "exception.type", error.get("code"))
        put(attrs, "exception.message", error.get("message"))
        put(attrs, "prism.failure_class", error.get("failureClass"))
        return Event("exception", attrs, nanos(event.ts))
    return Event(f"prism.{event.type}", attrs, nanos(event.ts))
