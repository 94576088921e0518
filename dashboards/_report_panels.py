"""The report dashboard: what ``prism-pipeline report`` draws, provisioned in Grafana as well.

Panels the other dashboards already have are taken from them by title (the same builder,
so the same SQL); the three only the report needs (turn latency by model, alerts, the most
expensive runs) are defined here with the shared panel factories. ``report_panels`` reads
the built dashboard back as plain data (kind, unit, raw SQL per target), so the HTML report
runs exactly the queries Grafana runs, through the same macro expander.

Example::

    for panel in report_panels():
        print(panel.row, panel.title, panel.kind, len(panel.targets))
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from grafana_foundation_sdk.models import dashboard as dashboard_models

from prism.dashboards._budgets import BUDGET_PANEL
from prism.dashboards._cache import cache_efficiency
from prism.dashboards._cost import _BILLABLE as BILLABLE
from prism.dashboards._cost import TOKENS, cost_and_usage
from prism.dashboards._errors import DashboardError
from prism.dashboards._panels import (
    CURRENCY,
    TENANT_FILTER,
    Board,
    _Built,
    bars,
    ch,
    currency_filter,
    currency_variable,
    table_panel,
    time_axis,
)
from prism.dashboards._sre import sre_overview

__all__ = ["OPTIONAL_ROWS", "REPORT_UID", "ReportPanel", "report_dashboard", "report_panels"]

REPORT_UID = "prism-report"

Builder = Callable[[str | None], dashboard_models.Dashboard]


def _turn_latency() -> Any:
    return bars(
        "Turn latency p50 / p95 by model",
        "Provider-turn latency (latency_ms of provider_turn_finished) in the time range, "
        "median and 95th percentile per provider / model.",
        "s",
        ch(
            f"""
            SELECT concat(ifNull(provider, '(none)'), ' / ', ifNull(model, '(none)')) AS model,
                   quantile(0.5)(latency_ms) / 1000 AS p50,
                   quantile(0.95)(latency_ms) / 1000 AS p95
            FROM turns
            WHERE kind = 'model' AND latency_ms IS NOT NULL AND $__timeFilter(ts)
              AND {TENANT_FILTER}
            GROUP BY model
            ORDER BY p95 DESC
            """
        ),
    )


def _alerts() -> Any:
    return table_panel(
        "Alerts",
        "Alerts raised and resolved in the time range, newest first: runs dying on a limit "
        "axis (run_limit_exhaustion) and runs gone stale (stale_run).",
        "short",
        ch(
            f"""
            SELECT ts, rule, state, tenant_id, key, value, threshold, message
            FROM alerts
            WHERE $__timeFilter(ts) AND {TENANT_FILTER}
            ORDER BY ts DESC, rule, key
            LIMIT 100
            """
        ),
        h=8,
        field_units={"ts": "dateTimeAsIso"},
    )


def _expensive_runs() -> Any:
    return table_panel(
        "Top expensive runs ($currency)",
        "The ten runs with the highest reported provider_turn cost in the time range in one "
        "currency (one table per currency: runs are ranked against runs of their own "
        "currency only), with their billable tokens; estimates are never priced.",
        "short",
        ch(
            f"""
            SELECT run_id, ifNull(tenant_id, '(none)') AS tenant,
                   ifNull(model, '(none)') AS model, ifNull(currency, '') AS currency,
                   toFloat64(sum(cost)) AS reported_cost,
                   sum({TOKENS}) AS billable_tokens, count() AS priced_turns
            FROM billing_usage
            WHERE cost IS NOT NULL AND {BILLABLE} AND {currency_filter()}
            GROUP BY run_id, tenant, model, currency
            ORDER BY reported_cost DESC, run_id
            LIMIT 10
            """
        ),
        h=8,
        field_units={"reported_cost": "none"},
        repeat=CURRENCY,
    )


def _cost(database: str | None) -> dashboard_models.Dashboard:
    """The cost dashboard with the tenant filter only: the report has no run filters."""
    return cost_and_usage(database, run_filters=False)


# Rows drawn only when a panel of theirs has rows: budgets exist only with a budgets file.
OPTIONAL_ROWS = frozenset({"Budgets"})

# (row title, [(source dashboard, panel title, width) or (None, factory, width)])
_LAYOUT: Sequence[tuple[str, Sequence[tuple[Builder | None, Any, int]]]] = (
    (
        "Headline",
        (
            (sre_overview, "Ingest freshness", 4),
            (sre_overview, "Stale (incomplete) runs", 4),
            (sre_overview, "Dead letters (range)", 4),
            (sre_overview, "Quarantined events (range)", 4),
            (_cost, "Billable tokens", 4),
            (cache_efficiency, "Cache hit rate", 4),
        ),
    ),
    (
        "Runs",
        (
            (sre_overview, "Runs by status", 12),
            (sre_overview, "Limit deaths by axis", 12),
        ),
    ),
    (
        "Cost and usage",
        (
            (_cost, "Billable tokens by tenant and model", 24),
            (_cost, "Reported cost by tenant and model ($currency)", 12),
        ),
    ),
    ("Budgets", ((_cost, BUDGET_PANEL, 24),)),
    (
        "Cache and latency",
        (
            (cache_efficiency, "Hit rate by provider / model", 12),
            (None, _turn_latency, 12),
        ),
    ),
    (
        "Rejected input",
        (
            (sre_overview, "Dead letters per minute by reason", 12),
            (sre_overview, "Quarantine per minute by reason", 12),
        ),
    ),
    ("Alerts", ((None, _alerts, 24),)),
    ("Cost per run", ((None, _expensive_runs, 24),)),
    ("Freshness", ((sre_overview, "Ingest lag (received_at - ts)", 24),)),
)


def _borrow(source: Builder, title: str, width: int) -> dashboard_models.Panel:
    """A copy of ``source``'s panel titled ``title``, laid out anew ``width`` columns wide."""
    model = source(None)
    for panel in model.panels or []:
        if getattr(panel, "title", None) == title and not isinstance(
            panel, dashboard_models.RowPanel
        ):
            borrowed = copy.deepcopy(panel)
            height = panel.grid_pos.h if panel.grid_pos else 8
            borrowed.grid_pos = dashboard_models.GridPos(h=height, w=width, x=0, y=0)
            return borrowed
    raise DashboardError(
        f"the report borrows panel {title!r} from dashboard {model.uid!r}, which has no "
        "panel of that title any more; update dashboards/_report_panels.py"
    )


def report_dashboard(database: str | None = None) -> dashboard_models.Dashboard:
    """The report as a Grafana dashboard (``prism-report``), panels qualified for ``database``.

    Example::

        model = report_dashboard()          # provisioned next to the other dashboards
    """
    b = Board(
        REPORT_UID,
        "Prism / Report",
        "The panels of `prism-pipeline report` (a self-contained HTML page): run outcomes, "
        "limit deaths, cost and tokens, budget crossings, cache hit rate, turn latency, "
        "rejected input, alerts, the most expensive runs and freshness.",
        database=database,
        tags=("prism", "report"),
        time_from="now-6h",
    )
    b.variable(currency_variable())
    for row, panels in _LAYOUT:
        b.row(row)
        for source, what, width in panels:
            if source is None:
                built = what().span(width).build()
                b.add(_Built(built))
            else:
                b.add(_Built(_borrow(source, what, width)))
    return b.build()


@dataclass(frozen=True, slots=True)
class ReportPanel:
    """One panel of the report as plain data: where it sits, how to draw it, its raw SQL."""

    row: str
    title: str
    description: str
    kind: str  # timeseries | barchart | stat | table
    unit: str
    targets: tuple[str, ...]  # raw SQL with Grafana macros and variables, in refId order
    stacked: bool = False
    bars: bool = False  # a time series drawn as bars
    field_units: tuple[tuple[str, str], ...] = ()
    width: int = 12  # of 24 grid columns, as in Grafana
    colors: tuple[tuple[str, str], ...] = ()  # fixed colours of series, by name
    time_axis: str | None = None  # the clock of a time series' x axis (EVENT/RECEIVE_TIME)
    repeat: str | None = None  # the variable Grafana repeats the panel over, one per value
    repeat_query: str = ""  # that variable's raw SQL (its values)
    optional: bool = False  # left out of the page when it has no rows (OPTIONAL_ROWS)


def report_panels(database: str | None = None) -> list[ReportPanel]:
    """The report dashboard's panels, in layout order, read back from its Grafana JSON."""
    from prism.dashboards._provisioning import dashboard_json

    data = dashboard_json(report_dashboard(database))
    queries = {v["name"]: v.get("query") or "" for v in data["templating"]["list"]}
    out: list[ReportPanel] = []
    row = ""
    for panel in data["panels"]:
        if panel["type"] == "row":
            row = panel["title"]
            continue
        defaults = panel.get("fieldConfig", {}).get("defaults", {})
        custom = defaults.get("custom", {})
        overrides = [
            (o["matcher"]["options"], p)
            for o in panel.get("fieldConfig", {}).get("overrides", [])
            if o["matcher"]["id"] == "byName"
            for p in o.get("properties", [])
        ]
        units = tuple((name, p["value"]) for name, p in overrides if p.get("id") == "unit")
        colors = tuple(
            (name, p["value"]["fixedColor"]) for name, p in overrides if p.get("id") == "color"
        )
        targets = tuple(t["rawSql"] for t in panel.get("targets", []))
        repeat = panel.get("repeat") or None
        out.append(
            ReportPanel(
                row=row,
                title=panel["title"],
                description=panel.get("description", ""),
                kind=panel["type"],
                unit=defaults.get("unit", "short"),
                targets=targets,
                stacked=custom.get("stacking", {}).get("mode", "none") != "none",
                bars=custom.get("drawStyle") == "bars",
                field_units=units,
                width=int(panel.get("gridPos", {}).get("w", 12)),
                colors=colors,
                time_axis=time_axis(targets) if panel["type"] == "timeseries" else None,
                repeat=repeat,
                repeat_query=queries.get(repeat, "") if repeat else "",
                optional=row in OPTIONAL_ROWS,
            )
        )
    return out
