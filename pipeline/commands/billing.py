"""``prism-pipeline billing`` and ``invoice``: billable usage as the billing team reads it.

``billing --from --to`` groups reported ``provider_turn`` usage (tokens and cost per
currency) and estimated tokens by confidence (never priced) by ``--group-by``, and says
per line who priced it (``runtime``, ``price_book``, ``unpriced``). ``invoice --month``
exports invoice lines per tenant and month, reconciled with the ledger. ``run_total`` rows
never count. See sinks/BILLING.md.

Periods are dates, ISO times, ``now``, ``today`` or relative to now (``-7d``, ``-12h``);
a bound left out is the ledger's own (its first or last billable usage), and ``--month``
takes ``this`` and ``last`` and defaults to the ledger's latest month. When nothing
matches, one line on stderr says so and what the ledger holds (for a ``--tenant`` it does
not know, the nearest tenant ids the caller may read); the exit code stays 0.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from dataclasses import astuple, fields
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Any

from prism.pipeline.commands._output import render, write_parquet
from prism.pipeline.commands.query import ExamplesFormatter, add_connection_args, connection

__all__ = ["FORMATS", "accept_spans_back", "add_output_args", "emit", "register", "when"]

FORMATS = ("table", "csv", "json", "parquet")
_DIMENSIONS = ("tenant", "account", "user", "agent", "model", "provider", "day", "month")
_RELATIVE_RE = re.compile(r"^-(\d+)([mhdw])$")
_UNITS = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
_WHEN_HELP = "YYYY-MM-DD, ISO time, now, today, or back from now: -30m, -12h, -7d, -2w"
_BILLING_EXAMPLES = """examples:
  prism-pipeline billing                                  # all the ledger holds
  prism-pipeline billing --from -7d --group-by agent,day  # the last 7 days, per agent and day
  prism-pipeline billing --from 2026-11-01 --to 2026-12-01 --tenant acme-corp --format csv
  prism-pipeline billing --totals --format json           # totals per kind and currency only"""
_INVOICE_EXAMPLES = """examples:
  prism-pipeline invoice                                  # the ledger's latest month, as a table
  prism-pipeline invoice --month last --format csv --out invoice.csv
  prism-pipeline invoice --month 2026-11 --tenant acme-corp --format json"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "billing",
        help="report billable usage for a period, grouped as you ask (tenant, agent, month...)",
        epilog=_BILLING_EXAMPLES,
        formatter_class=ExamplesFormatter,
        description=(
            "Sums provider_turn usage recorded in [--from, --to) (UTC; --to is exclusive; "
            "a bound left out is the ledger's first or last billable usage): "
            "reported tokens and cost per currency, and estimated tokens per confidence, "
            "never priced. Estimates superseded by a reported row are left out. Reported "
            "usage that arrived without a cost is priced with the price book (`prices "
            "load`) at its event time; the priced_by column says runtime, price_book or "
            "unpriced. The table ends with the totals per currency."
        ),
    )
    p.add_argument(
        "--from", dest="start", type=when, help=f"start: {_WHEN_HELP} (default: the ledger's first)"
    )
    p.add_argument(
        "--to", dest="end", type=when, help="end, exclusive, as --from (default: the ledger's last)"
    )
    p.add_argument("--tenant", help="only this tenant")
    accept_spans_back(p)
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
        epilog=_INVOICE_EXAMPLES,
        formatter_class=ExamplesFormatter,
        description=(
            "One line per tenant, provider, model, currency and pricing source (runtime, "
            "price_book, unpriced) with the event count, tokens and cost of the month's "
            "reported provider_turn usage; estimates are never invoiced. The lines are "
            "reconciled with the ledger (events per tenant, reported cost per tenant and "
            "currency); a difference is reported and the command exits 1."
        ),
    )
    inv.add_argument(
        "--month",
        help="YYYY-MM (e.g. 2026-11), this or last (UTC; default: the ledger's latest month)",
    )
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


def accept_spans_back(parser: argparse.ArgumentParser) -> None:
    """Let ``--from -7d`` through: argparse takes a value that starts with '-' for an option
    unless it looks like a negative number, so spans back count as numbers here."""
    parser._negative_number_matcher = re.compile(r"^-\d+$|^-\d*\.\d+$|^-\d+[mhdw]$")


def when(text: str, now: datetime | None = None) -> date | datetime:
    """A period bound: a date (YYYY-MM-DD, its midnight UTC), else an aware UTC time: an ISO
    time, ``now``, ``today`` or a span back from now (``-30m``, ``-12h``, ``-7d``, ``-2w``)."""
    now = now or datetime.now(UTC)
    word = text.strip().lower()
    relative = _RELATIVE_RE.match(word)
    if word == "now":
        return now
    if word == "today":
        return datetime.combine(now.date(), time(), UTC)
    if relative:
        return now - timedelta(**{_UNITS[relative[2]]: int(relative[1])})
    try:
        if len(text) == 10:
            return date.fromisoformat(text)
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a date (YYYY-MM-DD), an ISO 8601 time (2026-11-30T12:00:00Z), "
            "now, today, or a span back from now (-30m, -12h, -7d, -2w)"
        ) from None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


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
    from prism.sinks._billing import billing_sql, line_columns, to_utc

    if args.show_sql:
        database = args.database or "prism"
        print(billing_sql(database, args.group_by, tenant=args.tenant is not None).strip())
        return 0
    client, database = connection(args, read_only=True)
    start, end = args.start, args.end
    if start is None or end is None:
        first, last = _span(client, database)
        if first is None or last is None:  # an empty ledger: said below, as no line matched
            start, end = start or datetime(1970, 1, 1, tzinfo=UTC), end or datetime.now(UTC)
        else:
            start = start or first
            end = end or last + timedelta(milliseconds=1)  # --to is exclusive
    defaulted = args.start is None or args.end is None
    if defaulted and to_utc(start) >= to_utc(end):  # e.g. --to -7d on a ledger of today
        lines = []
    else:
        lines = billing_report(
            client, database, start, end, tenant=args.tenant, group_by=args.group_by
        )
    if not lines:
        period = f"from {_iso(start)} to {_iso(end)}"
        _explain_nothing(args, client, database, period, "leave out --from and --to for all of it")
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
    from prism.sinks._invoice import resolve_month

    client, database = connection(args, read_only=True)
    if args.month is None:
        _, last = _span(client, database)
        month = resolve_month("this", last)  # the ledger's latest month (this one when empty)
    else:
        month = resolve_month(args.month)
    inv = invoice(client, database, month, tenant=args.tenant)
    if not inv.lines:
        _explain_nothing(args, client, database, f"in {month}", "without --month: its latest")
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
    if args.format != "table" and inv.lines:
        events = sum(line.event_count for line in inv.lines)
        print(f"reconciled {events} event(s) of {month} with the ledger", file=sys.stderr)
    return 0


def _span(
    client: Any, database: str, tenant: str | None = None
) -> tuple[datetime | None, datetime | None]:
    """The first and last billable usage the caller may read (row policies apply)."""
    from prism.sinks import query

    where = " AND tenant_id = {tenant:String}" if tenant is not None else ""
    [(count, first, last)] = query(
        client,
        f"SELECT count(), min(recorded_at), max(recorded_at) FROM {database}.billing_usage "
        f"WHERE NOT superseded{where}",
        {"tenant": tenant} if tenant is not None else None,
    ).rows
    return (first, last) if count else (None, None)


def _tenants(client: Any, database: str) -> list[str]:
    """The tenant ids with billable usage that the caller may read (row policies apply)."""
    from prism.sinks import query

    rows = query(
        client,
        f"SELECT DISTINCT tenant_id FROM {database}.billing_usage "
        "WHERE tenant_id IS NOT NULL ORDER BY tenant_id",
    ).rows
    return [str(tenant) for (tenant,) in rows]


def _explain_nothing(
    args: argparse.Namespace, client: Any, database: str, period: str, hint: str
) -> None:
    """One line on stderr: why no line matched (unknown tenant, or a period off the data)."""
    tenant: str | None = args.tenant

    def say(message: str) -> None:
        print(f"prism-pipeline {args.command}: {message}", file=sys.stderr)

    if tenant is not None:
        known = _tenants(client, database)
        if tenant not in known:
            near = difflib.get_close_matches(tenant, known, n=3, cutoff=0.5)
            near_hint = (
                f"nearest: {', '.join(near)}"
                if near
                else f"the ledger has {len(known)} tenant(s) with billable usage"
                + (f", e.g. {', '.join(known[:3])}" if known else "")
            )
            say(f"no billable usage for tenant {tenant!r} in the ledger; {near_hint}")
            return
    first, last = _span(client, database, tenant)
    whose = "its" if tenant is not None else "the ledger's"
    if first is None or last is None:
        say(f"no billable usage {period}: the ledger holds none yet")
        return
    say(
        f"no billable usage {period}"
        + (f" for tenant {tenant!r}" if tenant is not None else "")
        + f"; {whose} billable usage runs from {_iso(first)} to {_iso(last)} ({hint})"
    )


def _iso(value: datetime | date) -> str:
    if not isinstance(value, datetime):
        return value.isoformat()
    value = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    return value.isoformat(timespec="seconds").replace("+00:00", "Z")
