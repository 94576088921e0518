"""The trace mapping (pipeline.traces): GenAI spans from ledger rows, and ids that never change.

A simulated fleet goes through the core into a ``FinalLedger`` (the rows the ledger's views
would return); its runs are mapped to spans and exported into the SDK's in-memory exporter.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import orjson
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from prism.pipeline.core import CoreConfig
from prism.pipeline.traces import (
    SEMCONV_VERSION,
    BilledCost,
    RunFacts,
    resource_for,
    run_spans,
    span_id_of,
    trace_id_of,
    trace_roots,
)
from prism.runtime.simulator import FleetConfig, simulate
from tests.fixtures.final_ledger import FinalLedger, feed_stream
from tests.fixtures.runs import NOW

CFG = CoreConfig(grace_period_s=86400, stale_after_s=3600, processing_grace=False)


@pytest.fixture(scope="module")
def ledger() -> FinalLedger:
    fleet = simulate(FleetConfig(runs=120, seed=5, limit_death_burst=3))
    values = [r.value for r in fleet.records]
    final, _ = feed_stream(values, config=CFG, source="t", partition_of=lambda v, n: 0, now=NOW)
    return final


def _facts(ledger: FinalLedger) -> dict[str, RunFacts]:
    events: dict[str, list[Any]] = {}
    for e in sorted(ledger.rows("events"), key=lambda e: (e.run_id, e.seq, e.event_id)):
        events.setdefault(e.run_id, []).append(e)
    usage: dict[str, list[Any]] = {}
    for u in ledger.rows("usage"):
        usage.setdefault(u.run_id, []).append(u)
    return {
        r.run_id: RunFacts(r, events.get(r.run_id, []), usage.get(r.run_id, []))
        for r in ledger.rows("runs")
    }


def _costs(facts: RunFacts) -> dict[str, BilledCost]:
    """The runtime's cost of reported rows, as billing prices them without a price book."""
    return {
        u.event_id: BilledCost(u.cost, u.currency, "runtime")
        for u in facts.usage
        if u.cost is not None and not u.estimated
    }


def _export(ledger: FinalLedger, order: list[str] | None = None) -> list[ReadableSpan]:
    facts = _facts(ledger)
    parents = {f.run.run_id: f.run.parent_run_id for f in facts.values()}
    roots = trace_roots(parents, facts)
    exporter = InMemorySpanExporter()
    for run_id in order or sorted(facts):
        f = facts[run_id]
        exporter.export(run_spans(f, roots[run_id], resource_for(), _costs(f)))
    return list(exporter.get_finished_spans())


def _identity(span: ReadableSpan) -> tuple[Any, ...]:
    """Everything an exported span says, ids and times included."""
    assert span.context is not None
    return (
        span.context.trace_id,
        span.context.span_id,
        span.parent.span_id if span.parent else None,
        span.name,
        span.kind,
        span.start_time,
        span.end_time,
        span.status.status_code,
        span.status.description,
        sorted((k, repr(v)) for k, v in (span.attributes or {}).items()),
        [(e.name, e.timestamp, sorted((e.attributes or {}).items())) for e in span.events],
        [(lk.context.trace_id, lk.context.span_id, dict(lk.attributes or {})) for lk in span.links],
    )


def test_exporting_twice_gives_the_same_ids_and_attributes_in_any_run_order(
    ledger: FinalLedger,
) -> None:
    first = sorted(_identity(s) for s in _export(ledger))
    order = sorted(_facts(ledger))
    random.Random(3).shuffle(order)
    again = sorted(_identity(s) for s in _export(ledger, order))
    assert again == first
    ids = [(i[0], i[1]) for i in first]
    assert len(set(ids)) == len(ids), "two spans share an id"


def test_every_run_is_one_invoke_agent_span_with_a_span_per_turn_and_tool_call(
    ledger: FinalLedger,
) -> None:
    spans = _export(ledger)
    by_run: dict[str, list[ReadableSpan]] = {}
    for s in spans:
        by_run.setdefault(str((s.attributes or {})["prism.run.id"]), []).append(s)
    facts = _facts(ledger)
    assert set(by_run) == set(facts)
    for run_id, f in facts.items():
        names = [s.name.split(" ")[0] for s in by_run[run_id]]
        turns = {(orjson.loads(e.payload)["turn"], orjson.loads(e.payload)["attempt"])
                 for e in f.events if e.type == "provider_turn_finished"}  # fmt: skip
        usage_only = {(u.turn, u.attempt) for u in f.usage
                      if u.scope == "provider_turn" and not u.superseded} - turns  # fmt: skip
        tools = [e for e in f.events if e.type == "tool_call_finished"]
        assert names.count("invoke_agent") == 1
        assert names.count("chat") == len(turns) + len(usage_only)
        assert names.count("execute_tool") == len(tools)
        root = by_run[run_id][0]
        assert root.name == f"invoke_agent {f.run.agent_id}"
        assert root.context is not None
        assert root.context.span_id == span_id_of(run_id)
        assert all(
            s.parent and s.parent.span_id == root.context.span_id for s in by_run[run_id][1:]
        )


def test_reported_tokens_and_cost_sum_to_the_ledger_and_estimates_stay_apart(
    ledger: FinalLedger,
) -> None:
    spans = [s for s in _export(ledger) if s.name.startswith("chat")]
    sums: dict[str, int] = {}
    estimated: dict[str, int] = {}
    cost = Decimal(0)
    for s in spans:
        a = s.attributes or {}
        if a.get("prism.usage.source") == "estimated":
            assert not any(k.startswith("gen_ai.usage") or "cost" in k for k in a), a
            assert a["prism.usage.confidence"] in ("low", "medium")
            estimated["input"] = estimated.get("input", 0) + int(a.get(
                "prism.usage.estimated.input_tokens", 0))  # fmt: skip
        for key in ("input_tokens", "output_tokens", "cache_read.input_tokens"):
            sums[key] = sums.get(key, 0) + int(a.get(f"gen_ai.usage.{key}", 0))  # type: ignore[call-overload]
        if "prism.usage.cost" in a:
            cost += Decimal(str(a["prism.usage.cost"]))
    rows = [u for u in ledger.rows("usage") if u.scope == "provider_turn" and not u.superseded]
    reported = [u for u in rows if not u.estimated]
    assert sums["input_tokens"] == sum(u.input_tokens or 0 for u in reported) > 0
    assert sums["output_tokens"] == sum(u.output_tokens or 0 for u in reported)
    assert sums["cache_read.input_tokens"] == sum(u.cache_read_tokens or 0 for u in reported)
    assert estimated["input"] == sum(u.input_tokens or 0 for u in rows if u.estimated) > 0
    assert cost == sum((u.cost or Decimal(0) for u in reported), Decimal(0))


def test_a_limit_death_is_an_error_status_with_the_breach_as_events(ledger: FinalLedger) -> None:
    deaths = [r for r in ledger.rows("runs") if r.exhaustion_limit and r.status == "failed"]
    assert deaths
    roots = {str((s.attributes or {})["prism.run.id"]): s for s in _export(ledger)
             if s.name.startswith("invoke_agent")}  # fmt: skip
    for run in deaths:
        root = roots[run.run_id]
        assert root.status.status_code is StatusCode.ERROR
        assert run.exhaustion_limit in (root.status.description or "")
        names = [e.name for e in root.events]
        assert {"prism.run_limit_exceeded", "prism.budget_exhausted", "exception"} <= set(names)
        breach = next(e for e in root.events if e.name == "prism.run_limit_exceeded")
        assert (breach.attributes or {})["prism.limit"] == run.exhaustion_limit
        assert (root.attributes or {})["error.type"] == run.error_code


def test_child_runs_are_invoke_agent_spans_under_their_parent_in_its_trace(
    ledger: FinalLedger,
) -> None:
    spans = {s.context.span_id: s for s in _export(ledger) if s.context is not None}
    children = [r for r in ledger.rows("runs") if r.parent_run_id]
    assert children
    for child in children:
        span = spans[span_id_of(child.run_id)]
        assert span.parent is not None and span.parent.span_id == span_id_of(child.parent_run_id)
        parent = spans.get(span_id_of(child.parent_run_id))
        if parent is not None:
            assert parent.context is not None and span.context is not None
            assert span.context.trace_id == parent.context.trace_id


def test_turn_spans_follow_the_conventions(ledger: FinalLedger) -> None:
    spans = _export(ledger)
    chat = next(s for s in spans if s.name.startswith("chat")
                and (s.attributes or {}).get("prism.usage.source") == "reported")  # fmt: skip
    a = chat.attributes or {}
    assert chat.name == f"chat {a['gen_ai.request.model']}"
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.provider.name"]
    assert isinstance(a["gen_ai.response.finish_reasons"], tuple | list)
    assert chat.end_time is not None and chat.start_time is not None
    assert chat.end_time - chat.start_time == int(float(a["prism.turn.latency_ms"]) * 1e6)  # type: ignore[arg-type]
    failed = [s for s in spans if s.name.startswith("execute_tool")
              and (s.attributes or {}).get("prism.tool.ok") is False]  # fmt: skip
    assert failed and all(s.status.status_code is StatusCode.ERROR for s in failed)
    assert all((s.attributes or {})["error.type"] == s.status.description for s in failed)


def test_a_producer_traceparent_becomes_a_link(ledger: FinalLedger) -> None:
    facts = next(f for f in _facts(ledger).values() if f.events)
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    events = [dataclasses.replace(e, traceparent=tp) for e in facts.events]
    spans = run_spans(RunFacts(facts.run, events, facts.usage), facts.run.run_id, resource_for())
    link = spans[0].links[0]
    assert (link.context.trace_id, link.context.span_id) == (
        0x0AF7651916CD43DD8448EB211C80319C,
        0xB7AD6B7169203331,
    )
    bad = [dataclasses.replace(e, traceparent="00-zz-1-01") for e in facts.events]
    assert run_spans(RunFacts(facts.run, bad, facts.usage), "r", resource_for())[0].links == ()


def test_trace_roots_follow_known_parents_and_stop_at_cycles() -> None:
    parents = {"c": "b", "b": "a", "a": None, "orphan": "gone", "x": "y", "y": "x"}
    roots = trace_roots(parents, parents)
    assert roots["c"] == roots["b"] == roots["a"] == "a"
    assert roots["orphan"] == "gone"  # the parent's own export joins the same trace
    assert roots["x"] == "y" and roots["y"] == "x"
    assert trace_id_of("a") != trace_id_of("b") and trace_id_of("a") == trace_id_of("a")


def test_the_pinned_names_are_those_of_the_installed_conventions() -> None:
    from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as g
    from opentelemetry.semconv.schemas import Schemas

    assert f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}" in {s.value for s in Schemas}
    names = {v for k, v in vars(g).items() if k.startswith("GEN_AI_") and isinstance(v, str)}
    sent = set(_attribute_names())
    assert {n for n in sent if n.startswith("gen_ai.") and n != "gen_ai.usage.cost"} <= names


def _attribute_names() -> Iterator[str]:
    fleet = simulate(FleetConfig(runs=40, seed=2))
    final, _ = feed_stream([r.value for r in fleet.records], config=CFG, source="t",
                           partition_of=lambda v, n: 0, now=NOW)  # fmt: skip
    for s in _export(final):
        yield from (s.attributes or {})


def test_the_package_exports_resolve() -> None:
    import prism.pipeline.traces as t

    assert all(hasattr(t, n) and not n.startswith("_") for n in t.__all__)
    assert len(set(t.__all__)) == len(t.__all__)
