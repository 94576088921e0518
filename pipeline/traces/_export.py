"""The export shell: ledger runs -> spans (``_mapping``) -> an OTLP exporter, in batches."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from clickhouse_connect.driver.client import Client
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from ._ledger import RunSelection, read_runs, select_runs
from ._mapping import SEMCONV_SCHEMA_URL, run_spans

__all__ = [
    "DEFAULT_SERVICE",
    "TraceExportError",
    "TraceSummary",
    "export_runs",
    "otlp_exporter",
    "resource_for",
]

DEFAULT_SERVICE = "prism-agent-runs"
BATCH_SPANS = 512  # spans per OTLP request


class TraceExportError(RuntimeError):
    """The OTLP endpoint refused or never acknowledged a batch of spans."""


@dataclass(slots=True)
class TraceSummary:
    """What an export sent: runs, distinct traces, spans, and spans per span name prefix."""

    runs: int = 0
    spans: int = 0
    traces: set[int] = field(default_factory=set)
    by_operation: dict[str, int] = field(default_factory=dict)

    def render(self) -> str:
        ops = ", ".join(f"{k}={v}" for k, v in sorted(self.by_operation.items())) or "none"
        return f"{self.runs} run(s) as {len(self.traces)} trace(s), {self.spans} span(s) ({ops})"


def resource_for(service: str = DEFAULT_SERVICE) -> Resource:
    """The resource of every exported span: the service (Jaeger) and project (Phoenix)."""
    return Resource(
        {"service.name": service, "openinference.project.name": service},
        schema_url=SEMCONV_SCHEMA_URL,
    )


def otlp_exporter(
    endpoint: str, headers: dict[str, str] | None = None, timeout: float = 30.0
) -> SpanExporter:
    """OTLP/HTTP (protobuf) to ``endpoint``, the collector's base URL or its ``/v1/traces``."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    url = endpoint.rstrip("/")
    if not url.endswith("/v1/traces"):
        url += "/v1/traces"
    return OTLPSpanExporter(endpoint=url, headers=headers or None, timeout=timeout)


def export_runs(
    client: Client,
    database: str,
    exporter: SpanExporter,
    selection: RunSelection | None = None,
    *,
    resource: Resource | None = None,
    endpoint_name: str = "the exporter",
    on_batch: Callable[[TraceSummary, int], None] | None = None,
) -> TraceSummary:
    """Export each selected run of the ledger as spans of its trace; raise if a batch fails.

    ``on_batch(summary, runs_selected)`` is called after each batch the exporter accepted.

    Example::

        summary = export_runs(client, "prism", otlp_exporter("http://127.0.0.1:4318"))
        print(summary.render())
    """
    resource = resource or resource_for()
    summary = TraceSummary()
    batch: list[ReadableSpan] = []
    ids = select_runs(client, database, selection or RunSelection())
    for facts, root, costs in read_runs(client, database, ids):
        spans = run_spans(facts, root, resource, costs)
        summary.runs += 1
        _count(summary, spans)
        batch.extend(spans)
        if len(batch) >= BATCH_SPANS:
            _send(exporter, batch, endpoint_name)
            batch = []
            if on_batch is not None:
                on_batch(summary, len(ids))
    if batch:
        _send(exporter, batch, endpoint_name)
        if on_batch is not None:
            on_batch(summary, len(ids))
    return summary


def _count(summary: TraceSummary, spans: Sequence[ReadableSpan]) -> None:
    for span in spans:
        summary.spans += 1
        assert span.context is not None
        summary.traces.add(span.context.trace_id)
        op = span.name.split(" ", 1)[0]
        summary.by_operation[op] = summary.by_operation.get(op, 0) + 1


def _send(exporter: SpanExporter, spans: list[ReadableSpan], endpoint_name: str) -> None:
    if exporter.export(spans) is not SpanExportResult.SUCCESS:
        raise TraceExportError(
            f"{endpoint_name} did not accept a batch of {len(spans)} span(s) within the "
            "timeout, retries included; check that an OTLP/HTTP receiver listens there (-v "
            "shows each attempt), or give a busy one more --timeout"
        )
