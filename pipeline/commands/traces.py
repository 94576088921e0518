"""``prism-pipeline traces``: replay the ledger's runs as OpenTelemetry GenAI traces over OTLP."""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import time
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

from prism.pipeline.commands._args import whole
from prism.pipeline.commands.billing import accept_spans_back
from prism.pipeline.commands.query import ExamplesFormatter, add_connection_args, connection

if TYPE_CHECKING:
    from prism.pipeline.traces import TraceSummary

__all__ = ["DEFAULT_ENDPOINT", "register"]

DEFAULT_ENDPOINT = "http://127.0.0.1:4318"
_HEADER_RE = re.compile(r"^([A-Za-z0-9-]+)=(.*)$")
_EXAMPLES = """examples:
  prism-pipeline traces                                     # every closed run, to 127.0.0.1:4318
  prism-pipeline traces --local phoenix                     # a local Phoenix, started if needed
  prism-pipeline traces --endpoint http://127.0.0.1:6006    # a Phoenix or collector of your own
  prism-pipeline traces --run run-42 --run run-43 --include-open
  prism-pipeline traces --from -24h --tenant acme-corp --header authorization='Bearer ...'
  prism-pipeline traces --dry-run                           # build the spans, send nothing"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "traces",
        help="export the ledger's runs as OpenTelemetry GenAI traces over OTLP (Phoenix, Jaeger)",
        epilog=_EXAMPLES,
        formatter_class=ExamplesFormatter,
        description=(
            "Reads runs from the ledger and sends each as one trace (OTLP/HTTP, protobuf) "
            "following the OpenTelemetry GenAI semantic conventions v1.44.0: the run an "
            "invoke_agent span, each provider turn a chat span with gen_ai.usage.* tokens, "
            "finish reasons and the billed cost, each tool call an execute_tool span, a child "
            "run an invoke_agent span under its parent's in the parent's trace. Span and "
            "trace ids derive from run and event ids and times are event time, so exporting "
            "again sends the same trace, not a copy. Open runs are left out unless "
            "--include-open. See docs/TRACES.md."
        ),
    )
    p.add_argument(
        "--endpoint",
        help="OTLP/HTTP base URL or its /v1/traces (default OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, "
        f"else OTEL_EXPORTER_OTLP_ENDPOINT, else {DEFAULT_ENDPOINT})",
    )
    p.add_argument(
        "--local",
        choices=("phoenix", "jaeger"),
        help="start (or reuse) the project's local Phoenix or Jaeger (prism-pipeline devstack "
        "phoenix|jaeger up; installed or built once) and send the traces there",
    )
    p.add_argument(
        "--header",
        dest="headers",
        action="append",
        default=[],
        type=_header,
        metavar="NAME=VALUE",
        help="an HTTP header for the endpoint, repeatable (e.g. authorization=...)",
    )
    p.add_argument("--run", dest="runs", action="append", default=[], metavar="RUN_ID",
                   help="only this run (repeatable)")  # fmt: skip
    p.add_argument("--from", dest="start", type=_when, help="runs started from: as billing --from")
    p.add_argument("--to", dest="end", type=_when, help="runs started before: as billing --to")
    accept_spans_back(p)
    p.add_argument("--tenant", help="only this tenant's runs")
    p.add_argument("--limit", type=whole(1), help="at most this many runs (earliest first)")
    p.add_argument(
        "--include-open", action="store_true", help="also runs still running or suspended"
    )
    p.add_argument(
        "--service-name",
        default=None,
        help="service.name and Phoenix project of the spans (default prism-agent-runs)",
    )
    p.add_argument(
        "--timeout",
        type=whole(1, 600),
        default=60,
        metavar="SECONDS",
        help="how long one batch may take, retries of a busy or absent endpoint included "
        "(default 60: a busy Phoenix answers 503 until it has caught up)",
    )
    p.add_argument("--dry-run", action="store_true", help="build the spans, send nothing")
    add_connection_args(p)
    p.set_defaults(func=_run)


def _header(text: str) -> tuple[str, str]:
    match = _HEADER_RE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE (e.g. authorization=...)")
    return match[1], match[2]


def _when(text: str) -> datetime:
    from prism.pipeline.commands.billing import when
    from prism.sinks._billing import to_utc

    return to_utc(when(text))


def endpoint_of(given: str | None) -> str:
    """``--endpoint``, else the OpenTelemetry variables, else the local default."""
    return (
        given
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or DEFAULT_ENDPOINT
    )


def _run(args: argparse.Namespace) -> int:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from prism.pipeline.traces import (
        DEFAULT_SERVICE,
        RunSelection,
        export_runs,
        otlp_exporter,
        resource_for,
    )

    if args.local and args.endpoint:
        raise ValueError("give --local or --endpoint, not both")
    service = args.service_name or DEFAULT_SERVICE
    view = None
    if args.local and not args.dry_run:
        args.endpoint, view = _local_backend(args.local, service)
    endpoint = endpoint_of(args.endpoint)
    if not re.match(r"^https?://", endpoint):
        raise ValueError(f"--endpoint {endpoint!r} is not an http(s) URL (e.g. {DEFAULT_ENDPOINT})")
    selection = RunSelection(
        run_ids=tuple(args.runs),
        start=args.start,
        end=args.end,
        tenant=args.tenant,
        include_open=args.include_open,
        limit=args.limit,
    )
    client, database = connection(args, read_only=True)
    if not args.verbose:  # its retries and failure end in our one line; -v shows each one
        logging.getLogger("opentelemetry.exporter.otlp.proto.http.trace_exporter").setLevel(
            logging.CRITICAL
        )
    if not args.dry_run:
        print(f"sending the runs to {endpoint} ...", file=sys.stderr)
    exporter = (
        InMemorySpanExporter()
        if args.dry_run
        else otlp_exporter(endpoint, dict(args.headers), timeout=args.timeout)
    )
    summary = export_runs(
        client,
        database,
        exporter,
        selection,
        resource=resource_for(service),
        endpoint_name=endpoint,
        on_batch=None if args.dry_run else _progress(),
    )
    if summary.runs == 0:
        print("prism-pipeline traces: no run matched (closed runs only without --include-open)",
              file=sys.stderr)  # fmt: skip
        return 0
    where = "built (dry run, nothing sent)" if args.dry_run else f"sent to {endpoint}"
    print(f"{summary.render()} {where}")
    if view:
        print(f"open {view}")
    return 0


def _progress() -> Callable[[TraceSummary, int], None]:
    """A line on stderr every 10 s of a long export (a busy Phoenix takes minutes)."""
    last = time.monotonic()

    def say(summary: TraceSummary, selected: int) -> None:
        nonlocal last
        if time.monotonic() - last >= 10:
            last = time.monotonic()
            print(f"  sent {summary.runs} of {selected} run(s), {summary.spans} span(s)",
                  file=sys.stderr)  # fmt: skip

    return say


def _local_backend(name: str, service: str) -> tuple[str, str]:
    """Start (or reuse) the local backend; its OTLP endpoint and the page that shows the runs."""
    from pathlib import Path

    from prism.devstack._jaeger import LocalJaeger, build_jaeger, jaeger_binary
    from prism.devstack._phoenix import LocalPhoenix, install_phoenix, phoenix_installed

    folder = Path(".data") / name
    if name == "jaeger":
        if not jaeger_binary().is_file():
            print("building Jaeger with Go, once (about 5 min)", file=sys.stderr)
        build_jaeger()
        jaeger = LocalJaeger(folder)
        jaeger.up()
        return jaeger.otlp_endpoint, f"{jaeger.query_url}/search?service={service}"
    if not phoenix_installed():
        print("installing Arize Phoenix in .cache/phoenix, once (about 2 min)", file=sys.stderr)
    install_phoenix()
    phoenix = LocalPhoenix(folder)
    phoenix.up()
    return phoenix.otlp_endpoint, f"{phoenix.url}/projects (project {service})"
