"""Run the report dashboard's queries on a ledger and shape the rows the way Grafana does.

The time range defaults to everything the ledger holds (event times and receive times),
the interval to about ``POINTS`` buckets of a round size, and the tenant variable to All
with its options from the dashboards' own tenant query. Each query goes through
``prism.dashboards.expand_query``, exactly as the Grafana plugin would send it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from prism.dashboards import (
    ALL,
    EVENT_TIME,
    RECEIVE_TIME,
    TOP_SERIES,
    ReportPanel,
    TimeRange,
    Variable,
    expand_query,
    report_panels,
)

__all__ = [
    "EVENT_TIME",
    "POINTS",
    "RECEIVE_TIME",
    "PanelResult",
    "ReportError",
    "Series",
    "categories",
    "clock_spans",
    "fold_series",
    "ledger_span",
    "pick_interval",
    "run_panels",
    "series_of",
    "stat_value",
]

POINTS = 60  # buckets across the range: readable bars in a static page
_STEPS = [
    timedelta(seconds=s)
    for s in (1, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200)
] + [timedelta(days=d) for d in (1, 2, 7, 14, 30)]

# (view, time column) pairs whose extent is the ledger's time span, by clock: event time
# (the runtimes' timestamps) and receive time (the pipeline's clock). On a replayed or
# simulated fleet the two lie hours or days apart, so each time series is drawn on the
# span of its own clock.
_SPAN_COLUMNS = {
    EVENT_TIME: (
        ("runs", "started_at"),
        ("runs", "last_event_at"),
        ("usage", "recorded_at"),
        ("alerts", "ts"),
    ),
    RECEIVE_TIME: (
        ("run_events", "received_at"),
        ("dead_letters", "received_at"),
        ("quarantine", "received_at"),
    ),
}


class ReportError(RuntimeError):
    """The report cannot be built (no ledger, an empty one, a bad time range)."""


@dataclass
class PanelResult:
    """One panel's rows (all targets together), the SQL that ran, or the error it met."""

    panel: ReportPanel  # a repeated panel's copy has the variable's value in its title
    time_range: TimeRange | None = None  # the range its queries ran for (its x axis)
    columns: list[str] = field(default_factory=list)
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    sql: list[str] = field(default_factory=list)
    error: str | None = None


@dataclass
class Series:
    """One line (or stack layer) of a time series: a name and its (time, value) points."""

    name: str
    points: list[tuple[datetime, float]]


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _number(value: Any) -> float | None:
    if value is None or isinstance(value, bool | str | bytes | datetime | date):
        return None
    if isinstance(value, Decimal | int | float):
        f = float(value)
        return None if f != f else f  # NaN (0/0 in SQL) is no value
    return None


def ledger_span(client: Any, database: str) -> tuple[datetime, datetime]:
    """Earliest and latest time the ledger knows (event or receive time), else ``ReportError``."""
    spans = clock_spans(client, database).values()
    return min(low for low, _ in spans), max(high for _, high in spans)


def clock_spans(client: Any, database: str) -> dict[str, tuple[datetime, datetime]]:
    """Earliest and latest time the ledger knows on each clock (event, receive) that has data;
    ``ReportError`` when it holds no ledger or nothing at all."""
    found = client.query(
        "SELECT count() FROM system.tables WHERE database = {db:String} AND name = 'runs'",
        parameters={"db": database},
    ).result_rows[0][0]
    if not found:
        raise ReportError(
            f"database {database!r} holds no ledger; run `make demo`, or `prism-pipeline "
            "migrate` and a worker, or pass --database / --clickhouse"
        )
    spans = {}
    for clock, columns in _SPAN_COLUMNS.items():
        lows, highs = [], []
        for view, column in columns:
            # A producer clock far in the future (the ledger keeps such runs, flagged) must
            # not stretch the page over decades: only times up to a day from now count.
            low, high, n = client.query(
                f"SELECT min({column}), max({column}), count({column}) FROM {database}.{view} "
                f"WHERE {column} <= now() + INTERVAL 1 DAY"
            ).result_rows[0]
            if n:
                lows.append(_utc(low))
                highs.append(_utc(high))
        if lows:
            spans[clock] = (min(lows), max(highs))
    if not spans:
        raise ReportError(
            f"the ledger {database!r} is empty; run `make demo` or a worker first, then report"
        )
    return spans


def pick_interval(start: datetime, end: datetime, points: int = POINTS) -> timedelta:
    """The smallest round interval that splits ``[start, end]`` into at most ``points`` buckets."""
    span = max(end - start, timedelta(seconds=1))
    for step in _STEPS:
        if span / step <= points:
            return step
    return _STEPS[-1]


def _tenant_variable(client: Any, database: str, tr: TimeRange, tenants: Sequence[str]) -> Variable:
    """The dashboards' tenant variable: All (options from the tenant query) or the given ones."""
    sql = (
        f"SELECT DISTINCT tenant_id FROM {database}.runs WHERE tenant_id IS NOT NULL "
        "AND $__timeFilter(last_event_at) ORDER BY tenant_id"
    )
    options = [r[0] for r in client.query(expand_query(sql, tr)).result_rows]
    return Variable("tenant", list(tenants) or [ALL], options=options)


def run_panels(
    client: Any,
    database: str,
    time_range: TimeRange,
    tenants: Sequence[str] = (),
    axes: Mapping[str, TimeRange] | None = None,
) -> list[PanelResult]:
    """Every report panel's targets, expanded for ``time_range`` and ``tenants``, run in order.

    A time series runs on the range of its own clock when ``axes`` has one (event time,
    receive time); a panel Grafana repeats over a variable (one per currency) runs once per
    value of that variable, as Grafana's copies do.
    """
    variables = [_tenant_variable(client, database, time_range, tenants)]
    results = []
    for panel in report_panels(database):
        tr = (axes or {}).get(panel.time_axis or "", time_range)
        if not panel.repeat:
            results.append(_run(client, PanelResult(panel, tr), variables))
            continue
        sql = expand_query(panel.repeat_query, time_range, variables)
        values = [str(r[0]) for r in client.query(sql).result_rows]
        for value in values or [""]:
            title = panel.title.replace(f"${panel.repeat}", value or "-")
            pinned = [*variables, Variable(panel.repeat, value)]
            result = PanelResult(dataclasses.replace(panel, title=title), tr)
            if values:
                _run(client, result, pinned)
            else:
                result.sql.append(sql)  # no value: Grafana shows the panel once, empty
            results.append(result)
    return results


def _run(client: Any, result: PanelResult, variables: list[Variable]) -> PanelResult:
    assert result.time_range is not None
    for raw in result.panel.targets:
        sql = expand_query(raw, result.time_range, variables)
        result.sql.append(sql)
        try:
            answer = client.query(sql)
        except Exception as exc:  # shown in the panel and reported by the command
            result.error = str(exc).strip().splitlines()[0][:500]
            break
        if not result.columns:
            result.columns = list(answer.column_names)
        result.rows += [tuple(r) for r in answer.result_rows]
    return result


def series_of(result: PanelResult) -> list[Series]:
    """Grafana's long-to-wide step: (time, [labels...], values...) rows become named series."""
    if not result.rows:
        return []
    sample = result.rows[0]
    time_i = next((i for i, v in enumerate(sample) if isinstance(v, datetime)), None)
    if time_i is None:
        return []
    labels = [i for i, v in enumerate(sample) if i != time_i and isinstance(v, str)]
    values = [i for i in range(len(sample)) if i != time_i and i not in labels]
    by_name: dict[str, list[tuple[datetime, float]]] = {}
    for row in result.rows:
        label = " / ".join(str(row[i]) for i in labels)
        for i in values:
            number = _number(row[i])
            if number is None:
                continue
            name = (
                label
                if label and len(values) == 1
                else " ".join(p for p in (label, result.columns[i]) if p)
            )
            by_name.setdefault(name, []).append((_utc(row[time_i]), number))
    return [Series(name, sorted(points)) for name, points in by_name.items()]


def fold_series(series: Sequence[Series], n: int = TOP_SERIES) -> list[Series]:
    """The ``n`` largest series by total, then the rest summed per time as one 'other'.

    For stacked charts only (their values add up): the dashboards fold in SQL, and this
    keeps any stack the page draws readable whatever a query returns.
    """
    if len(series) <= n + 1:  # already few enough: only 'other' goes last, as in the legend
        return sorted(series, key=lambda s: s.name == "other")
    ranked = sorted(series, key=lambda s: (s.name == "other", -sum(v for _, v in s.points), s.name))
    rest: dict[datetime, float] = {}
    for s in ranked[n:]:
        for t, v in s.points:
            rest[t] = rest.get(t, 0.0) + v
    return [*ranked[:n], Series("other", sorted(rest.items()))]


def categories(result: PanelResult) -> tuple[list[str], list[tuple[str, list[float | None]]]]:
    """A bar chart's categories (first text column) and one value list per numeric column."""
    if not result.rows:
        return [], []
    sample = result.rows[0]
    label_i = next((i for i, v in enumerate(sample) if isinstance(v, str)), 0)
    numeric = [i for i in range(len(sample)) if i != label_i]
    names = [str(r[label_i]) for r in result.rows]
    groups = [(result.columns[i], [_number(r[i]) for r in result.rows]) for i in numeric]
    return names, [(n, v) for n, v in groups if any(x is not None for x in v)]


def stat_value(result: PanelResult) -> float | None:
    """A stat panel's value: the first number of the first row."""
    for value in result.rows[0] if result.rows else ():
        number = _number(value)
        if number is not None:
            return number
    return None
