"""Every run of the ledger as one OpenTelemetry GenAI trace, exported over OTLP.

Follows the OpenTelemetry semantic conventions v1.44.0 for GenAI spans (``SEMCONV_VERSION``;
every ``gen_ai.*`` name there is Development status): the run is an ``invoke_agent {agent}``
span, each provider turn attempt a ``chat {model}`` span with ``gen_ai.usage.*`` and
``gen_ai.response.finish_reasons``, each tool call an ``execute_tool {tool}`` span, a child
run an ``invoke_agent`` span under its parent's in the parent's trace. Prism's facts without
a convention are ``prism.*``; estimated usage is only ever ``prism.usage.estimated.*``.
Ids derive from run and event ids, so a replay re-exports the same trace. docs/TRACES.md
has the mapping and the local Phoenix and Jaeger to look at it in.

Errors: ``TraceExportError`` (the endpoint refused a batch); the ledger's own
``prism.sinks.LedgerError`` family for reads.

Example::

    from prism.pipeline.traces import RunSelection, export_runs, otlp_exporter
    from prism.sinks import connect

    client = connect("chdb://./.data/ledger", "prism", create=False)
    summary = export_runs(client, "prism", otlp_exporter("http://127.0.0.1:4318"),
                          RunSelection(tenant="acme-corp"))
    print(summary.render())
"""

from ._export import (
    DEFAULT_SERVICE,
    TraceExportError,
    TraceSummary,
    export_runs,
    otlp_exporter,
    resource_for,
)
from ._ledger import RunSelection, billed_costs, read_runs, select_runs
from ._mapping import (
    SEMCONV_SCHEMA_URL,
    SEMCONV_VERSION,
    BilledCost,
    RunFacts,
    run_spans,
    span_id_of,
    trace_id_of,
    trace_roots,
)

__all__ = [
    "DEFAULT_SERVICE",
    "SEMCONV_SCHEMA_URL",
    "SEMCONV_VERSION",
    "BilledCost",
    "RunFacts",
    "RunSelection",
    "TraceExportError",
    "TraceSummary",
    "billed_costs",
    "export_runs",
    "otlp_exporter",
    "read_runs",
    "resource_for",
    "run_spans",
    "select_runs",
    "span_id_of",
    "trace_id_of",
    "trace_roots",
]
