"""``prism-pipeline budgets status``: each budget's spend, remaining and forecast, from the ledger.

Spend is what ``billing`` bills (the same query, read-only): reported ``provider_turn``
usage of the budget's scope in its current period, priced by the runtime or the price
book, in the budget's currency; another currency counts through the budgets file's rate
valid on the usage's (UTC) day, else it is shown as unconverted. Estimates are never
priced: their tokens are shown as at risk. The forecast is the spend at the period's end
if it goes on at the rate of the period so far.
"""

from __future__ import annotations

import argparse
from datetime import UTC, date, datetime, time
from decimal import Context, Decimal
from pathlib import Path
from typing import Any

from prism.pipeline.commands.billing import accept_spans_back, add_output_args, emit, when
from prism.pipeline.commands.query import ExamplesFormatter, add_connection_args, connection

__all__ = ["COLUMNS", "register", "status_rows"]

_EXAMPLES = """examples:
  prism-pipeline budgets status --budgets budgets.toml
  prism-pipeline budgets status --budgets budgets.yaml --at 2026-11-30T23:00:00Z
  prism-pipeline budgets status --budgets budgets.toml --format json --out status.json"""
COLUMNS = [
    "budget", "scope", "currency", "period_start", "period_end", "amount", "spent",
    "remaining", "used_ratio", "forecast", "state", "thresholds_crossed",
    "estimated_rows", "estimated_input_tokens", "estimated_output_tokens",
    "unconverted", "unpriced_rows",
]  # fmt: skip
_DIMS = {"tenant": "tenant_id", "account": "account_id", "user": "user_id", "agent": "agent_id",
         "model": "model"}  # fmt: skip
_EXACT = Context(prec=80)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "budgets",
        help="spend budgets: each scope's spend, remaining and forecast (budgets status)",
        formatter_class=ExamplesFormatter,
        epilog=_EXAMPLES,
        description="Spend budgets of a budgets file (docs/BUDGETS.md) against the ledger.",
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    s = actions.add_parser(
        "status",
        help="print each budget's spend, remaining and forecast to its period's end",
        formatter_class=ExamplesFormatter,
        epilog=_EXAMPLES,
        description=(
            "For each budget of --budgets, its current period (day, week or month in its "
            "time zone, holding --at): the spend billing bills for its scope (reported "
            "provider_turn usage, runtime cost or price book; never estimates), what "
            "remains of the amount, the ratio used, and the forecast to the period's end "
            "at the rate so far. Spend in another currency counts through the file's "
            "dated rate, else shows as unconverted. Reads the ledger only."
        ),
    )
    s.add_argument("--budgets", type=Path, required=True, metavar="FILE",
                   help="the budgets file (.toml, .yaml or .yml)")  # fmt: skip
    s.add_argument(
        "--at", type=when, default=None, metavar="TIME",
        help="judge the periods holding this time (default now): YYYY-MM-DD, ISO time, "
        "now, today, or back from now (-12h, -7d)",
    )  # fmt: skip
    accept_spans_back(s)
    add_output_args(s)
    add_connection_args(s)
    s.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from prism.pipeline.budgets import BudgetConfigError, read_budgets
    from prism.sinks import billing_report

    try:
        budgets = read_budgets(args.budgets)
    except BudgetConfigError as exc:  # a usage error (exit 2), named as the file said
        raise ValueError(str(exc)) from None
    at = args.at or datetime.now(UTC)
    if not isinstance(at, datetime):
        at = datetime.combine(at, time(), UTC)
    client, database = connection(args, read_only=True)

    def lines(budget: Any, start: datetime, end: datetime) -> list[Any]:
        dims = (*(d for d, _ in budget.scope.items()), "day")
        return billing_report(
            client, database, start, end, tenant=budget.scope.tenant, group_by=dims
        )

    emit(args, COLUMNS, status_rows(budgets, lines, at))
    return 0


def status_rows(budgets: Any, lines_of: Any, at: datetime) -> list[tuple[Any, ...]]:
    """One row per budget (``COLUMNS``): ``lines_of(budget, start, end)`` gives the billing
    lines of its period, grouped by its scope's dimensions and the day."""
    from prism.pipeline.budgets import period_bounds
    from prism.pipeline.budgets._period import from_us, to_us
    from prism.pipeline.budgets._records import money

    rows = []
    for b in budgets.budgets:
        lo, hi = period_bounds(b.period, b.tz, to_us(at))
        start, end = from_us(lo), from_us(hi)
        spent = Decimal(0)
        unconverted: dict[str, Decimal] = {}
        est, unpriced = [0, 0, 0], 0
        for line in lines_of(b, start, end):
            if any(getattr(line, _DIMS[d]) != v for d, v in b.scope.items()):
                continue
            if line.kind == "estimated":
                est[0] += line.rows
                est[1] += line.input_tokens or 0
                est[2] += line.output_tokens or 0
            elif line.cost is None or line.currency is None:
                unpriced += line.rows
            elif line.currency == b.currency:
                spent = _EXACT.add(spent, line.cost)
            elif (rate := budgets.rate(line.currency, b.currency, _day_us(line.day))) is not None:
                spent = _EXACT.add(spent, _EXACT.multiply(line.cost, rate))
            else:
                unconverted[line.currency] = _EXACT.add(
                    unconverted.get(line.currency, Decimal(0)), line.cost
                )
        elapsed = min(max(to_us(at) - lo, 0), hi - lo)
        forecast = spent if elapsed == 0 else _EXACT.divide(spent * (hi - lo), Decimal(elapsed))
        crossed = [label for label, amount in b.threshold_amounts() if spent >= amount]
        state = "exceeded" if spent >= b.amount else ("warning" if crossed else "ok")
        row = (
            b.name, b.scope_id, b.currency, start.astimezone(b.tz).isoformat(),
            end.astimezone(b.tz).isoformat(), money(b.amount), money(spent),
            money(b.amount - spent), f"{spent / b.amount:.4f}", money(forecast), state,
            ",".join(crossed), est[0], est[1], est[2],
            ",".join(f"{money(v)} {c}" for c, v in sorted(unconverted.items())), unpriced,
        )  # fmt: skip
        rows.append(row)
    return rows


def _day_us(day: date | None) -> int:
    from prism.pipeline.budgets._period import to_us

    if day is None:
        return 0
    return to_us(datetime.combine(day, time(), UTC))
