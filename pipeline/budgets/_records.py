"""The desk's outputs: ``budget_threshold`` alert rows and ``prism.budget-state`` records.

The record (schemas/CONTRACT.md, "Outputs for runtimes and tracing tools"), keyed by the
scope id; money is a decimal string (exact), times ISO 8601 (the period in the budget's
time zone, ``asOf`` in UTC)::

    {"scope": {"tenant": "acme", "agent": "support-bot"}, "currency": "USD",
     "period": {"start": "2026-11-01T00:00:00+01:00", "end": "2026-12-01T00:00:00+01:00"},
     "amount": "1000", "spent": "812.4", "provisional": "830.1",
     "estimatedAtRisk": {"rows": 3, "inputTokens": 5200, "outputTokens": 900},
     "unconverted": {"EUR": "12.5"}, "state": "warning", "thresholdsCrossed": ["50%", "80%"],
     "asOf": "2026-11-20T13:59:30+00:00"}

``estimatedAtRisk`` is tokens, never money: estimates are never priced (rule 6).
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

import orjson

from prism.pipeline.core import OutRecord
from prism.schemas import AlertRow

from ._config import Budget
from ._period import from_us

__all__ = ["RULE_BUDGET", "alert_id", "budget_alert", "money", "state_record", "state_value"]

RULE_BUDGET = "budget_threshold"
_CUT = Decimal("1e-12")


def money(value: Decimal) -> str:
    """An exact decimal string, at most 12 decimals, no exponent (``812.4``, ``0``)."""
    text = format(value.quantize(_CUT).normalize(), "f")
    return "0" if text in ("-0", "0E-12") else text


def local(budget: Budget, at_us: int) -> datetime:
    return from_us(at_us).astimezone(budget.tz)


def alert_id(budget: Budget, label: str, period_start_us: int) -> str:
    """``budget_threshold:<scope id>:<threshold>:<period start, ISO 8601 in the zone>``."""
    return f"{RULE_BUDGET}:{budget.scope_id}:{label}:{local(budget, period_start_us).isoformat()}"


def budget_alert(
    budget: Budget,
    label: str,
    threshold: Decimal,
    period: tuple[int, int],
    state: str,
    at_us: int,
    spent: Decimal,
    top: str = "",
) -> AlertRow:
    """The firing (at the crossing) or resolved (at the period's end) row of one threshold."""
    ratio = spent / budget.amount
    start, end = local(budget, period[0]), local(budget, period[1])
    span = f"{start.isoformat()}..{end.isoformat()}"
    if state == "firing":
        message = (
            f"budget {budget.name!r} ({budget.scope_id}) reached {label}: spent "
            f"{money(spent)} of {money(budget.amount)} {budget.currency} "
            f"(budget_used_ratio {ratio:.4f}) in {budget.period} {span}"
        ) + (f"; {top}" if top else "")
    else:
        message = f"budget {budget.name!r} ({budget.scope_id}) {label}: period {span} ended"
    return AlertRow(
        alert_id=alert_id(budget, label, period[0]),
        rule=RULE_BUDGET,
        state=state,
        tenant_id=budget.scope.tenant,
        key=f"{budget.scope_id}:{label}",
        value=float(spent),
        threshold=float(threshold),
        window_start=from_us(period[0]),
        window_end=from_us(at_us),
        ts=from_us(at_us),
        message=message,
        version=1 if state == "firing" else 2,
    )


def state_value(
    budget: Budget,
    period: tuple[int, int],
    spent: Decimal,
    provisional: Decimal,
    at_risk: tuple[int, int, int],
    unconverted: dict[str, Decimal],
    crossed: list[str],
) -> dict[str, Any]:
    """The record's value without ``asOf`` (what decides whether it changed)."""
    state = "exceeded" if spent >= budget.amount else ("warning" if crossed else "ok")
    return {
        "scope": dict(budget.scope.items()),
        "currency": budget.currency,
        "period": {
            "start": local(budget, period[0]).isoformat(),
            "end": local(budget, period[1]).isoformat(),
        },
        "amount": money(budget.amount),
        "spent": money(spent),
        "provisional": money(provisional),
        "estimatedAtRisk": {
            "rows": at_risk[0],
            "inputTokens": at_risk[1],
            "outputTokens": at_risk[2],
        },
        "unconverted": {c: money(v) for c, v in sorted(unconverted.items()) if v},
        "state": state,
        "thresholdsCrossed": crossed,
    }


def state_record(budget: Budget, value: dict[str, Any], as_of_us: int) -> OutRecord:
    """The compacted ``prism.budget-state`` record of one budget, keyed by its scope id."""
    return OutRecord(
        key=budget.scope_id.encode(),
        value=orjson.dumps({**value, "asOf": from_us(as_of_us).isoformat()}),
    )
