"""``prism-pipeline billing`` and ``invoice``: billable usage as the billing team reads it.

``billing --from --to`` groups reported ``provider_turn`` usage (tokens and cost per
currency) and estimated tokens by confidence (never priced) by ``--group-by``, and says
per line who priced it (``runtime``, ``price_book``, ``unpriced``). ``invoice --month``
exports invoice lines per tenant and month, reconciled with the ledger. ``run_total`` rows
never count. See sinks/BILLING.md.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import astuple, fields
from datetime import date, datetime
from pathlib import Path
from typing import Any

from prism.pipeline.commands._output import render, write_parquet
from prism.pipeline.commands.query import add_connection_args, connection

__all__ = ["FORMATS", "add_output_args", "emit", "register"]

FORMATS = ("table", "csv", "json", "parquet")
_DIMENSIONS = ("tenant", "account", "user", "agent", "model", "provider", "day", "month")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "billing",
        help="report billable usage for a period, grouped as you ask (tenant, agent, month...)",
        description=(
            "Sums provider_turn usage recorded in [--from, --to) (UTC; --to is exclusive): "
            "reported tokens and cost per currency, and estimated tokens per confidence, "
            "never priced. Estimates superseded by a reported row are left out. Reported "
            "usage that arrived without a cost is priced with the price book (`prices "
            "load`) at its event time; the priced_by column says runtime, price_book or "
            "unpriced. The table ends with the totals per currency."
        ),
    )
    p.add_argument(
        "--from", dest="start", required=True, type=_when, help="start, YYYY-MM-DD or ISO time"
    )
    p.add_argument(
        "--to", dest="end", required=True, type=_when, help="end (exclusive), YYYY-MM-DD or ISO"
    )
    p.add_argument("--tenant", help="only this tenant")
    p.add_argument(
        "--group-by",
        type=_group_by,
        default=("tenant", "provider", "model"),
        metavar="DIMS",
        help=f"comma-separated, in order, from {', '.join(_DIMENSIONS)} "
        "(default tenant,provider,model)",
    )
    p.add_argument(
        "--totals",
        action="store_true",
        help="print only the totals per kind and currency (rows by who priced them, tokens, cost)",
    )
    p.add_argument(
        "--show-sql",
        action="store_true",
        help="print the report's SQL for this --group-by (parameters start, end, tenant) "
        "and exit without connecting",
    )
    add_output_args(p)
    add_connection_args(p)
    p.set_defaults(func=_run)

    inv = sub.add_parser(
        "invoice",
        help="export invoice lines per tenant for one month, reconciled with the ledger",
        description=(
            "One line per tenant, provider, model, currency and pricing source (runtime, "
            "price_book, unpriced) with the event count, tokens and cost of the month's "
            "reported provider_turn usage; estimates are never invoiced. The lines are "
            "reconciled with the ledger (events per tenant, reported cost per tenant and "
            "currency); a difference is reported and the command exits 1."
        ),
    )
    inv.add_argument("--month", required=True, help="the month, YYYY-MM (e.g. 2026-11)")
    inv.add_argument("--tenant", help="only this tenant")
    add_output_args(inv)
    add_connection_args(inv)
    inv.set_defaults(func=_run_invoice)


def add_output_args(p: argparse.ArgumentParser) -> None:
    """``--format`` (table, csv, json, parquet) and ``--out``."""
    p.add_argument(
        "--format",
        choices=FORMATS,
        default="table",
        help="table (for people: thousands separators, cost at 6 decimals), csv or json "
        "(exact decimals), parquet (needs --out)",
    )
    p.add_argument("--out", type=Path, metavar="FILE", help="write to FILE instead of stdout")


def emit(
    args: argparse.Namespace, columns: list[str], rows: list[tuple[Any, ...]], extra: str = ""
) -> None:
    """Print (or write to ``--out``) the rows in ``--format``; ``extra`` follows a table."""
    if args.format == "parquet":
        if args.out is None:
            raise ValueError("--format parquet writes a binary file: give --out FILE")
        write_parquet(columns, rows, args.out)
        print(f"wrote {len(rows)} row(s) to {args.out}", file=sys.stderr)
        return
    text = render(columns, rows, args.format, human=True)
    if args.format == "table" and extra:
        text += "\n\n" + extra
    if args.out is None:
        print(text)
        return
    args.out.write_text(text + "\n", encoding="utf-8")
    print(f"wrote {len(rows)} row(s) to {args.out}", file=sys.stderr)


def _when(text: str) -> date | datetime:
    try:
        if len(text) == 10:
            return date.fromisoformat(text)
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a date (YYYY-MM-DD) or ISO 8601 time (2025-01-31T12:00:00Z)"
        ) from None


def _group_by(text: str) -> tuple[str, ...]:
    dims = tuple(d.strip() for d in text.split(",") if d.strip())
    unknown = [d for d in dims if d not in _DIMENSIONS]
    if not dims or unknown:
        raise argparse.ArgumentTypeError(
            f"cannot group by {', '.join(map(repr, unknown or [text]))}; choose from "
            f"{', '.join(_DIMENSIONS)} (comma-separated, e.g. agent,month)"
        )
    if len(set(dims)) != len(dims):
        raise argparse.ArgumentTypeError(f"--group-by {text!r} names a dimension twice")
    return dims


def _run(args: argparse.Namespace) -> int:
    from prism.sinks import BillingTotal, billing_report, billing_totals
    from prism.sinks._billing import billing_sql, line_columns

    if args.show_sql:
        database = args.database or "prism"
        print(billing_sql(database, args.group_by, tenant=args.tenant is not None).strip())
        return 0
    client, database = connection(args, read_only=True)
    lines = billing_report(
        client, database, args.start, args.end, tenant=args.tenant, group_by=args.group_by
    )
    totals = billing_totals(lines)
    total_columns = [f.name for f in fields(BillingTotal)]
    total_rows = [astuple(t) for t in totals]
    if args.totals:
        emit(args, total_columns, total_rows)
        return 0
    footer = "Totals per currency\n" + render(total_columns, total_rows, "table", human=True)
    emit(args, line_columns(args.group_by), [line.values() for line in lines], footer)
    return 0


def _run_invoice(args: argparse.Namespace) -> int:
    from prism.sinks import InvoiceLine, Reconciliation, invoice

    client, database = connection(args, read_only=True)
    inv = invoice(client, database, args.month, tenant=args.tenant)
    checks = [
        (r.tenant_id, r.month, r.figure, r.currency, r.ledger, r.invoice, r.ok)
        for r in inv.reconciliation
    ]
    check_columns = [f.name for f in fields(Reconciliation)] + ["ok"]
    footer = "Reconciliation with the ledger\n" + render(check_columns, checks, "table", human=True)
    columns = [f.name for f in fields(InvoiceLine)]
    emit(args, columns, [astuple(line) for line in inv.lines], footer)
    wrong = [r for r in inv.reconciliation if not r.ok]
    if wrong:
        first = wrong[0]
        print(
            f"prism-pipeline invoice: error: {len(wrong)} figure(s) do not reconcile, e.g. "
            f"tenant {first.tenant_id!r} {first.figure} {first.currency or ''}: ledger "
            f"{first.ledger}, invoice lines {first.invoice}",
            file=sys.stderr,
        )
        return 1
    if args.format != "table":
        events = sum(line.event_count for line in inv.lines)
        print(f"reconciled {events} event(s) of {args.month} with the ledger", file=sys.stderr)
    return 0
