"""Spend budgets on the dashboards: the crossings the budget desk wrote, and their rule.

What the ledger knows of budgets is the desk's ``budget_threshold`` alert rows
(docs/BUDGETS.md, "Alerts"): one firing row per scope x threshold x period at the
crossing, ``value`` the settled spend then, ``threshold`` the threshold's amount, ``key``
``<scope id>:<threshold>``, and the message ``... spent <spend> of <amount> <currency>
(budget_used_ratio ...)``; a resolved row at the period's end. The budgets file's
amounts and a scope's current spend are not in the ledger (the spend lives in
``prism.budget-state`` and ``prism-pipeline budgets status``): every figure here is exact
at the crossing it comes from, and a scope that crossed no threshold has no row. Money
is never summed: a row is one scope and period, in its budget's one currency.
"""

from __future__ import annotations

from typing import Any

from prism.dashboards._alert_rules import AlertSpec
from prism.dashboards._alert_rules import _runbook as runbook
from prism.dashboards._panels import TENANT_FILTER, ch, table_panel

__all__ = [
    "BUDGET_PANEL",
    "BUDGET_RULE",
    "BUDGET_RULE_UID",
    "BUDGET_WINDOW_S",
    "budget_alert_spec",
    "budget_panel",
]

BUDGET_RULE = "budget_threshold"
BUDGET_PANEL = "Budgets: spend vs amount per scope"
BUDGET_RULE_UID = "prism-budget-threshold"
# A month is the longest period: a crossing stays open (unresolved) at most that long.
BUDGET_WINDOW_S = 32 * 86_400

_SCOPE = r"extract(key, '^(.*):[^:]*$')"
_LABEL = r"extract(key, ':([^:]*)$')"
_FIGURES = r"'spent ([0-9.]+) of ([0-9.]+) ([A-Z]{3}) \\(budget_used_ratio'"


def budget_panel() -> Any:
    """One row per scope and period with a crossing: currency, amount, spend, ratio, the
    thresholds crossed (labels and amounts) and whether the period ended."""
    return table_panel(
        BUDGET_PANEL,
        "Per budget scope and period with a threshold crossed in the time range (from the "
        "budget desk's budget_threshold alert rows): the budget's currency and amount, the "
        "settled spend at the latest crossing and its share of the amount, the thresholds "
        "crossed and their amounts, and whether the period has ended. Exact at the crossing; "
        "a scope's spend since then is in prism.budget-state and `budgets status`. One "
        "currency per row, never summed.",
        "short",
        ch(
            f"""
            SELECT scope, period_start, currency, amount, spent_at_last_crossing,
                   spent_at_last_crossing / nullIf(amount, 0) AS used_ratio,
                   thresholds_crossed, threshold_amounts, last_crossing,
                   if(ended, 'ended', 'open') AS period
            FROM (
                SELECT {_SCOPE} AS scope, window_start AS period_start,
                       any(regexpExtract(message, {_FIGURES}, 3)) AS currency,
                       any(toFloat64OrNull(regexpExtract(message, {_FIGURES}, 2))) AS amount,
                       max(value) AS spent_at_last_crossing,
                       arrayStringConcat(arraySort(groupArray(threshold_label)), ', ')
                           AS thresholds_crossed,
                       arrayStringConcat(
                           arrayMap(x -> toString(x), arraySort(groupArray(threshold))), ', '
                       ) AS threshold_amounts,
                       max(ts) AS last_crossing,
                       max(resolved) AS ended
                FROM (
                    SELECT *, {_LABEL} AS threshold_label,
                           alert_id IN (
                               SELECT alert_id FROM alerts
                               WHERE rule = '{BUDGET_RULE}' AND state = 'resolved'
                                 AND ts <= $__toTime
                           ) AS resolved
                    FROM alerts
                    WHERE rule = '{BUDGET_RULE}' AND state = 'firing' AND $__timeFilter(ts)
                      AND {TENANT_FILTER}
                )
                GROUP BY scope, period_start
            )
            ORDER BY currency, used_ratio DESC, scope, period_start
            """
        ),
        h=8,
        field_units={
            "period_start": "dateTimeAsIso",
            "last_crossing": "dateTimeAsIso",
            "used_ratio": "percentunit",
            "amount": "none",
            "spent_at_last_crossing": "none",
        },
    )


def budget_alert_spec() -> AlertSpec:
    """Open budget crossings: one series per scope and threshold whose period has not ended.

    The desk already decided each crossing once (one firing row per scope x threshold x
    period, however many workers), so the rule passes the decision on rather than judging
    a rate: it fires while the crossing's period is open and clears at its resolution.
    """
    return AlertSpec(
        BUDGET_RULE_UID,
        "Budget threshold crossed",
        f"""
        SELECT {_SCOPE} AS scope, {_LABEL} AS budget_threshold, count() AS open_crossings
        FROM alerts
        WHERE rule = '{BUDGET_RULE}' AND state = 'firing' AND $__timeFilter(ts)
          AND alert_id NOT IN (
              SELECT alert_id FROM alerts
              WHERE rule = '{BUDGET_RULE}' AND state = 'resolved' AND ts <= $__toTime
          )
        GROUP BY scope, budget_threshold
        """,
        BUDGET_WINDOW_S,
        0.0,
        "Budget {{ $labels.scope }} crossed {{ $labels.budget_threshold }}",
        "The settled spend of budget scope {{ $labels.scope }} reached its "
        "{{ $labels.budget_threshold }} threshold in the current period (the budget desk's "
        "budget_threshold alert row). It clears when the period ends. The desk also sends "
        "the row to prism.alerts and the worker's webhook with an idempotency key.",
        runbook(
            "a tenant (or one of its accounts, users, agents or models) spent the share of its "
            "budget a threshold names, counted from billed provider_turn usage only, settled "
            "at the watermark less the allowed lateness (docs/BUDGETS.md).",
            'prism-pipeline query "SELECT ts, key, value, threshold, message FROM alerts '
            f"WHERE rule = '{BUDGET_RULE}' ORDER BY ts DESC LIMIT 20\"; "
            "prism-pipeline budgets status --budgets <budgets file>",
            "read the top runs and models in the message; tell the scope's owner; at 100% "
            "runtimes following prism.budget-state with a BudgetGuard refuse new provider "
            "calls for the scope until the period rolls over, so raise the amount in the "
            "budgets file (and restart the workers) if the spend is expected, or stop the "
            "runaway agent if not.",
        ),
        "warning",
        "OK",
        "0s",  # the desk decided the crossing once; nothing to smooth
    )
