"""``prism-pipeline report``: write the ledger's charts as one self-contained HTML page."""

from __future__ import annotations

import argparse
from datetime import date, datetime
from pathlib import Path

from prism.pipeline.commands.billing import accept_spans_back, when
from prism.pipeline.commands.query import ExamplesFormatter, add_connection_args, connection

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="write an HTML page of charts from the ledger (runs, limits, cost, cache, alerts)",
        description=(
            "Runs the panels of the Grafana dashboard prism-report (the same SQL, expanded "
            "as Grafana does) on the ledger and writes one self-contained HTML page: inline "
            "SVG charts, no script, nothing fetched from the network. Open it in any browser. "
            "The time range defaults to everything the ledger holds."
        ),
        epilog=(
            "examples:\n"
            "  prism-pipeline report                    # everything, to .data/report.html\n"
            "  prism-pipeline report --from -24h --out /tmp/day.html\n"
            "  prism-pipeline report --from 2026-11-30 --to 2026-12-01 --tenant acme-corp"
        ),
        formatter_class=ExamplesFormatter,
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="PATH",
        help="where to write the page; its directory must exist (default .data/report.html)",
    )
    p.add_argument(
        "--from",
        dest="start",
        type=_when,
        help="start: YYYY-MM-DD, ISO time, now, today or -7d, -12h (default: data)",
    )
    p.add_argument("--to", dest="end", type=_when, help="end, as --from (default: data)")
    accept_spans_back(p)
    p.add_argument(
        "--tenant",
        action="append",
        default=[],
        metavar="ID",
        help="only this tenant in tenant-scoped panels (repeat for several; default all)",
    )
    add_connection_args(p)
    p.set_defaults(func=_run)


def _when(text: str) -> datetime:
    """``billing``'s period bounds, always as an aware UTC time (a date is its midnight)."""
    from prism.sinks._billing import to_utc

    value: date | datetime = when(text)
    return to_utc(value)


def _out_path(out: Path | None, default: Path) -> Path:
    """Where the page goes; a mistyped ``--out`` is refused, never made into directories."""
    path = out if out is not None else default
    if path.is_dir():
        raise ValueError(f"--out {path} is a directory; name the file, e.g. {path / 'report.html'}")
    if out is not None and not path.parent.is_dir():
        raise ValueError(
            f"--out {path}: the directory {path.parent} does not exist; create it first "
            "(mkdir -p) or pick another path"
        )
    return path


def _run(args: argparse.Namespace) -> int:
    try:
        from prism.pipeline.report import DEFAULT_OUT, build_report
    except ImportError as exc:  # grafana-foundation-sdk comes with the dashboards extra
        raise RuntimeError(
            f"the report needs the dashboards extra ({exc}); install it with "
            "pip install 'prism-pipeline[pipeline,dashboards]'"
        ) from None
    from prism.pipeline.settings import load_settings
    from prism.sinks import redact_dsn  # the ledger's own rule for hiding passwords

    out = _out_path(args.out, DEFAULT_OUT)
    client, database = connection(args, read_only=True)
    dsn = args.clickhouse or load_settings().clickhouse_dsn
    report = build_report(
        client,
        database,
        ledger=redact_dsn(dsn),
        start=args.start,
        end=args.end,
        tenants=args.tenant,
    )
    created = not out.parent.exists()  # only the default's directory (.data) may be missing
    path = report.write(out)
    if created:
        print(f"created the directory {path.parent}")
    drawn = len(report.results) - len(report.empty) - len(report.failed)
    print(f"wrote {path} ({drawn} of {len(report.results)} panels with data)")
    for result in report.empty:
        print(f"  no data: {result.panel.title}")
    for result in report.failed:
        print(f"  query failed: {result.panel.title}: {result.error}")
    print(f"open it: file://{path}")
    return 1 if report.failed else 0
