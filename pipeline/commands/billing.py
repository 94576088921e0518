"""``prism-pipeline billing --from --to``: billable usage per tenant, provider, model, currency.

Reported ``provider_turn`` usage with its cost, and separately estimated tokens by
confidence (never priced). ``run_total`` rows never count. See sinks/BILLING.md.
"""

from __future__ import annotations

import argparse
from dataclasses import astuple, fields
from datetime import date, datetime

from prism.pipeline.commands.query import FORMATS, add_connection_args, connection, render

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "billing",
        help="report billable usage for a period (per tenant, provider, model, currency)",
        description=(
            "Sums provider_turn usage recorded in [--from, --to) (UTC; --to is exclusive): "
            "reported tokens and cost per currency, and estimated tokens per confidence, "
            "never priced. Estimates superseded by a reported row are left out."
        ),
    )
    p.add_argument(
        "--from", dest="start", required=True, type=_when, help="start, YYYY-MM-DD or ISO time"
    )
    p.add_argument(
        "--to", dest="end", required=True, type=_when, help="end (exclusive), YYYY-MM-DD or ISO"
    )
    p.add_argument("--tenant", help="only this tenant")
    p.add_argument("--format", choices=FORMATS, default="table", help="output format")
    add_connection_args(p)
    p.set_defaults(func=_run)


def _when(text: str) -> date | datetime:
    try:
        if len(text) == 10:
            return date.fromisoformat(text)
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a date (YYYY-MM-DD) or ISO 8601 time (2025-01-31T12:00:00Z)"
        ) from None


def _run(args: argparse.Namespace) -> int:
    from prism.sinks import BillingLine, billing_report

    client, database = connection(args)
    lines = billing_report(client, database, args.start, args.end, tenant=args.tenant)
    columns = [f.name for f in fields(BillingLine)]
    print(render(columns, [astuple(line) for line in lines], args.format))
    return 0
