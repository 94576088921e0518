"""The trace export against real backends: a local Jaeger v2 and a local Arize Phoenix.

A fixed simulated fleet goes through the core into a chDB ledger (with the producers'
``traceparent`` headers, as the worker stores them), is exported over OTLP/HTTP to each
backend, and is read back through the backend's own query API: every closed run is there
with the right number of spans, the ``gen_ai.*`` attributes as sent, token sums equal to
the ledger's billable usage, the finish reasons of the ledger's turns, and (Phoenix) chat
spans classified as LLM spans with their token counts. ``make test`` builds Jaeger and
installs Phoenix first (``make trace-backends``); a backend that cannot be installed on
this machine is skipped with the reason, one that is installed but does not start fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from prism.devstack import DevstackError
from prism.devstack._jaeger import LocalJaeger, build_jaeger
from prism.devstack._phoenix import LocalPhoenix, install_phoenix
from prism.pipeline._store import LedgerStore
from prism.pipeline.core import CoreConfig, InRecord, Intake, store_isolating
from prism.pipeline.traces import export_runs, otlp_exporter, resource_for
from prism.runtime.simulator import FleetConfig, simulate, write_jsonl
from prism.sinks import LedgerWriter, migrate, query

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

FLEET = FleetConfig(runs=80, seed=31, limit_death_burst=4)
Spans = dict[int, dict[str, Any]]  # span id -> {"name", "parent", "trace", "attrs", "kind"?}


def _installed(install: Callable[[], Path], what: str) -> None:
    try:
        install()
    except DevstackError as exc:
        pytest.skip(f"{what} cannot be installed on this machine: {exc}")


@pytest.fixture(scope="module")
def jaeger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalJaeger]:
    _installed(build_jaeger, "Jaeger (built with Go)")
    backend = LocalJaeger(tmp_path_factory.mktemp("jaeger"))
    backend.up(timeout=60)
    try:
        yield backend
    finally:
        backend.down()


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPhoenix]:
    _installed(install_phoenix, "Arize Phoenix (pip install arize-phoenix)")
    backend = LocalPhoenix(tmp_path_factory.mktemp("phoenix"))
    backend.up(timeout=240)  # database migrations on a new folder; slower on a busy machine
    try:
        yield backend
    finally:
        backend.down()


@pytest.fixture
def ledger(ch_client: Any, ch_database: str) -> tuple[Any, str]:
    """The fleet in a fresh ledger, stored as the worker stores Kafka records (traceparent)."""
    fleet = simulate(FLEET)
    migrate(ch_client, ch_database)
    store = LedgerStore(LedgerWriter(ch_client, ch_database))
    intake = Intake(CoreConfig(processing_grace=False))
    records = [
        InRecord(r.value, "prism.agent-events", 0, i, r.key, _traceparent(r.headers))
        for i, r in enumerate(fleet.records)
    ]
    now = time.time()
    store_isolating(intake, {0: records}, now, store)
    store(intake.finalize(now))
    return ch_client, ch_database


def _traceparent(headers: Any) -> str | None:
    return next((v.decode() for k, v in headers or () if k == "traceparent"), None)


def _sent(client: Any, database: str, service: str) -> Spans:
    """What the export sends, from the SDK's in-memory exporter (the reference)."""
    memory = InMemorySpanExporter()
    export_runs(client, database, memory, resource=resource_for(service))
    out: Spans = {}
    for s in memory.get_finished_spans():
        assert s.context is not None
        out[s.context.span_id] = {"name": s.name, "attrs": dict(s.attributes or {}),
                                  "trace": s.context.trace_id,
                                  "parent": s.parent.span_id if s.parent else None,
                                  "links": sorted((lk.context.trace_id, lk.context.span_id)
                                                  for lk in s.links)}  # fmt: skip
    return out


def _expected(client: Any, database: str) -> dict[str, Any]:
    """The ledger's own figures, by its SQL: closed runs, span counts, tokens, stop reasons."""
    runs = [r[0] for r in query(client, f"SELECT run_id FROM {database}.runs "
                                "WHERE status NOT IN ('running', 'suspended')").rows]  # fmt: skip
    counts = {r[0]: r[1] + r[2] + 1 for r in query(client,
        f"SELECT run_id, countIf(type = 'provider_turn_finished'), "
        f"countIf(type = 'tool_call_finished') FROM {database}.run_events "
        "GROUP BY run_id").rows}  # fmt: skip
    tokens = {r[0]: r[1:] for r in query(client,
        f"SELECT run_id, sum(input_tokens), sum(output_tokens), sum(cache_read_tokens), "
        f"sum(cache_write_tokens) FROM {database}.billing_usage "
        "WHERE NOT estimated AND NOT superseded GROUP BY run_id").rows}  # fmt: skip
    stops = {(r[0], r[1], r[2]): r[3] for r in query(client,
        f"SELECT run_id, turn, attempt, stop_reason FROM {database}.turns "
        "WHERE kind = 'model'").rows}  # fmt: skip
    return {"runs": set(runs), "counts": counts, "tokens": tokens, "stops": stops}


_TOKEN_KEYS = ("input_tokens", "output_tokens", "cache_read.input_tokens",
               "cache_creation.input_tokens")  # fmt: skip


def _check(got: Spans, sent: Spans, ledger: dict[str, Any]) -> None:
    """The backend's spans against what was sent and what the ledger says."""
    by_run: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for span in got.values():
        by_run[span["attrs"]["prism.run.id"]].append(span)
    assert set(by_run) == ledger["runs"] and len(ledger["runs"]) > 50
    for run_id, spans in by_run.items():
        assert len(spans) == ledger["counts"][run_id], run_id
        sums = [sum(int(s["attrs"].get(f"gen_ai.usage.{k}", 0)) for s in spans)
                for k in _TOKEN_KEYS]  # fmt: skip
        want = [int(v or 0) for v in ledger["tokens"].get(run_id, (0, 0, 0, 0))]
        assert sums == want, run_id
    assert got.keys() == sent.keys()
    for span_id, span in got.items():
        mine = sent[span_id]
        assert (span["name"], span["trace"], span["parent"]) == (
            mine["name"], mine["trace"], mine["parent"])  # fmt: skip
        raw = {k: v for k, v in span["attrs"].items() if k.startswith("gen_ai.")}
        assert raw == {k: _plain(v) for k, v in mine["attrs"].items() if k.startswith("gen_ai.")}
        if span["name"].startswith("chat") and "prism.turn.event_missing" not in span["attrs"]:
            key = (span["attrs"]["prism.run.id"], span["attrs"]["prism.turn"],
                   span["attrs"]["prism.turn.attempt"])  # fmt: skip
            assert span["attrs"]["gen_ai.response.finish_reasons"] == [ledger["stops"][key]]
    kinds = Counter(s["attrs"]["gen_ai.operation.name"] for s in got.values())
    assert kinds["chat"] > 100 and kinds["execute_tool"] > 100, kinds


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


# -- Jaeger: /api/v3/traces -------------------------------------------------------------------


def _any_value(v: dict[str, Any]) -> Any:
    if "stringValue" in v:
        return v["stringValue"]
    if "intValue" in v:
        return int(v["intValue"])
    if "doubleValue" in v:
        return float(v["doubleValue"])
    if "boolValue" in v:
        return v["boolValue"]
    if "arrayValue" in v:
        return [_any_value(x) for x in v["arrayValue"].get("values", [])]
    return None


def _jaeger_spans(jaeger: LocalJaeger, service: str, traces: int) -> Spans:
    url = (f"{jaeger.query_url}/api/v3/traces?query.service_name={service}"
           "&query.start_time_min=2000-01-01T00:00:00Z&query.start_time_max=2199-01-01T00:00:00Z"
           f"&query.num_traces={traces + 10}")  # fmt: skip
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            text = response.read().decode()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:  # "No traces found" (yet)
            return {}
        raise
    out: Spans = {}
    decoder, pos = json.JSONDecoder(), 0
    while pos < len(text.strip()):  # the gateway may stream one object per chunk
        doc, pos = decoder.raw_decode(text, pos)
        while pos < len(text) and text[pos].isspace():
            pos += 1
        for rs in doc["result"]["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for s in ss.get("spans", []):
                    attrs = {a["key"]: _any_value(a["value"]) for a in s.get("attributes", [])}
                    parent = int(s["parentSpanId"], 16) if s.get("parentSpanId") else None
                    out[int(s["spanId"], 16)] = {
                        "name": s["name"], "attrs": attrs,
                        "trace": int(s["traceId"], 16), "parent": parent,
                        "links": sorted((int(lk["traceId"], 16), int(lk["spanId"], 16))
                                        for lk in s.get("links", []))}  # fmt: skip
    return out


def test_jaeger_holds_every_run_as_exported(jaeger: LocalJaeger, ledger: tuple[Any, str]) -> None:
    client, database = ledger
    service = f"prism-test-{uuid.uuid4().hex[:8]}"
    summary = export_runs(client, database, otlp_exporter(jaeger.otlp_endpoint),
                          resource=resource_for(service))  # fmt: skip
    sent = _sent(client, database, service)
    got: Spans = {}
    deadline = time.monotonic() + 60
    while len(got) < len(sent) and time.monotonic() < deadline:  # the collector batches
        got = _jaeger_spans(jaeger, service, len(summary.traces))
        time.sleep(0.5)
    _check(got, sent, _expected(client, database))
    # the producers' traceparents (kept in run_events) are links to their spans
    assert all(got[i]["links"] == sent[i]["links"] for i in sent)
    assert sum(1 for span in sent.values() if span["links"]) > len(sent) / 2


# -- Phoenix: /v1/projects/<project>/spans --------------------------------------------------


def _phoenix_spans(phoenix: LocalPhoenix, project: str) -> Spans:
    out: Spans = {}
    cursor = ""
    while True:
        url = f"{phoenix.url}/v1/projects/{project}/spans?limit=1000" + (
            f"&cursor={cursor}" if cursor else "")  # fmt: skip
        try:
            with urllib.request.urlopen(url, timeout=30) as response:
                page = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 404:  # the project appears with its first span
                return out
            raise
        for s in page["data"]:
            parent = int(s["parent_id"], 16) if s.get("parent_id") else None
            out[int(s["context"]["span_id"], 16)] = {
                "name": s["name"], "attrs": s["attributes"], "kind": s["span_kind"],
                "trace": int(s["context"]["trace_id"], 16), "parent": parent}  # fmt: skip
        cursor = page.get("next_cursor") or ""
        if not cursor:
            return out


def test_phoenix_holds_every_run_and_reads_chat_spans_as_llm_spans(
    phoenix: LocalPhoenix, ledger: tuple[Any, str]
) -> None:
    client, database = ledger
    project = f"prism-test-{uuid.uuid4().hex[:8]}"
    export_runs(client, database, otlp_exporter(phoenix.otlp_endpoint),
                resource=resource_for(project))  # fmt: skip
    sent = _sent(client, database, project)
    got: Spans = {}
    deadline = time.monotonic() + 180
    while len(got) < len(sent) and time.monotonic() < deadline:  # Phoenix inserts in the back
        time.sleep(1)
        got = _phoenix_spans(phoenix, project)
    # Phoenix adds its OpenInference reading (llm.*, tool.name, session.id) beside ours
    _check(got, sent, _expected(client, database))
    for span in got.values():
        attrs = span["attrs"]
        op = attrs["gen_ai.operation.name"]
        assert span["kind"] == {"chat": "LLM", "execute_tool": "TOOL"}.get(op, span["kind"])
        if op == "chat" and "gen_ai.usage.input_tokens" in attrs:
            assert attrs["llm.token_count.prompt"] == attrs["gen_ai.usage.input_tokens"]
            assert attrs["llm.token_count.completion"] == attrs["gen_ai.usage.output_tokens"]
            assert attrs["llm.model_name"] == attrs["gen_ai.request.model"]
        if op == "chat" and attrs.get("prism.usage.source") == "estimated":
            assert "llm.token_count.prompt" not in attrs and "llm.cost.total" not in attrs


def test_the_command_sends_the_runs_of_a_ledger_file(jaeger: LocalJaeger, tmp_path: Path) -> None:
    """``prism-pipeline traces`` end to end: a replayed file's runs, found in Jaeger."""
    fleet = simulate(FleetConfig(runs=20, seed=4))
    write_jsonl(fleet, tmp_path / "fleet.jsonl")
    dsn = f"chdb://{tmp_path}/ledger"
    env = {**os.environ, "PRISM_CLICKHOUSE_DATABASE": "prism"}

    def cli(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "prism.pipeline.cli", *args,
                               "--clickhouse", dsn], capture_output=True, text=True, env=env,
                              timeout=300, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    cli("ingest-file", str(tmp_path / "fleet.jsonl"), "--no-progress")
    service = f"prism-cli-{uuid.uuid4().hex[:8]}"
    said = cli("traces", "--endpoint", jaeger.otlp_endpoint, "--service-name", service)
    assert f"sent to {jaeger.otlp_endpoint}" in said
    runs = int(said.split(" run(s)")[0])
    assert runs >= 15
    spans = int(said.split(" span(s)")[0].split(", ")[-1])
    got: Spans = {}
    deadline = time.monotonic() + 60
    while len(got) < spans and time.monotonic() < deadline:  # the collector batches
        time.sleep(0.5)
        got = _jaeger_spans(jaeger, service, runs)
    assert len({s["attrs"]["prism.run.id"] for s in got.values()}) == runs
    assert len(got) == spans
