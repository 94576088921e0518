"""What the report page must never do: add or rank money across currencies, colour a run
status by chance, plot receive time on an event-time axis, or stack more series than a
reader can tell apart. The ledger is a fake that answers the report's queries by their
shape, so each rule is checked on the page the report builds."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from prism.dashboards import OTHER_COLOR, RUN_STATUSES, STATUS_COLORS
from prism.pipeline.report import build_report
from prism.pipeline.report._data import PanelResult, Series

EVENT_DAY = datetime(2026, 11, 30, 0, 0, tzinfo=UTC)  # the fleet's own timestamps
RECEIVED = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)  # replayed three days later
NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


@dataclass
class _Answer:
    column_names: list[str]
    result_rows: list[tuple[Any, ...]]


class FakeLedger:
    """Answers the report's queries by what they select; records every SQL it ran."""

    def __init__(self) -> None:
        self.sql: list[str] = []

    def query(self, sql: str, parameters: Any = None) -> _Answer:
        self.sql.append(sql)
        if "system.tables" in sql:
            return _Answer(["n"], [(1,)])
        span = re.match(r"SELECT min\((\w+)\)", sql)
        if span:
            low = RECEIVED if span.group(1) == "received_at" else EVENT_DAY
            return _Answer(["lo", "hi", "n"], [(low, low + timedelta(hours=2), 10)])
        if "SELECT DISTINCT tenant_id" in sql:
            return _Answer(["tenant_id"], [("acme",), ("umbrella",)])
        if "SELECT DISTINCT ifNull(currency" in sql:
            return _Answer(["currency"], [("EUR",), ("USD",)])
        currency = "EUR" if "'EUR'" in sql else "USD" if "'USD'" in sql else None
        if "reported_cost" in sql and "$__" not in sql and "AS label" in sql:
            # the cost chart: one series per tenant / model, in the panel's currency only
            t = EVENT_DAY + timedelta(minutes=10)
            rows = [(t, f"{currency}-tenant / m", 5.0 if currency == "EUR" else 900.0)]
            return _Answer(["time", "label", "reported_cost"], rows)
        if "run_id, ifNull(tenant_id" in sql:
            runs = {"EUR": [("run-eur", "umbrella", "m", "EUR", 7.0, 10, 1)],
                    "USD": [("run-usd", "acme", "m", "USD", 900.0, 10, 1)]}  # fmt: skip
            cols = ["run_id", "tenant", "model", "currency", "reported_cost", "tokens", "turns"]
            return _Answer(cols, runs.get(currency or "", runs["EUR"] + runs["USD"]))
        if "countIf(status = 'succeeded')" in sql:
            t = EVENT_DAY + timedelta(minutes=30)
            return _Answer(["time", *RUN_STATUSES], [(t, *range(1, len(RUN_STATUSES) + 1))])
        if "FROM" in sql and ".dead_letters" in sql and "AS time" in sql:
            rows = [(RECEIVED + timedelta(minutes=m), "unparsable", 2.0) for m in (5, 60, 115)]
            return _Answer(["time", "code", "per_minute"], rows)
        return _Answer([], [])


def _report() -> tuple[Any, FakeLedger]:
    ledger = FakeLedger()
    return build_report(ledger, "t", ledger="chdb://fake", now=NOW), ledger


def _figure(html: str, title: str) -> str:
    match = re.search(rf'<figure [^>]*data-title="{re.escape(title)}".*?</figure>', html, re.S)
    assert match, f"no panel titled {title!r}"
    return match.group(0)


def test_money_is_charted_and_ranked_per_currency_never_across() -> None:
    report, ledger = _report()
    titles = [r.panel.title for r in report.results]
    for name in ("Reported cost by tenant and model", "Top expensive runs"):
        assert f"{name} (EUR)" in titles and f"{name} (USD)" in titles, titles
        assert not any(t.startswith(name) and "(" not in t for t in titles)
    for currency in ("EUR", "USD"):
        chart = _figure(report.html, f"Reported cost by tenant and model ({currency})")
        assert f"{currency}-tenant" in chart
        assert ("USD" if currency == "EUR" else "EUR") + "-tenant" not in chart
        table = _figure(report.html, f"Top expensive runs ({currency})")
        run_ids = re.findall(r"<td>(run-\w+)</td>", table)
        assert run_ids == [f"run-{currency.lower()}"], run_ids
    # every query that adds up cost ran for one currency
    for sql in ledger.sql:
        if "sum(cost)" in sql and "billing_usage" in sql and "AS label" in sql:
            assert "'EUR'" in sql or "'USD'" in sql, sql


def test_each_run_status_has_its_one_colour_and_place_in_the_legend() -> None:
    report, _ = _report()
    figure = _figure(report.html, "Runs by status")
    fills = dict(re.findall(r'data-series="(\w+)"[^>]*fill="(#[0-9A-Fa-f]{6})"', figure))
    assert fills == STATUS_COLORS
    legend = re.findall(r'<span style="--c:(#[0-9A-Fa-f]{6})">(\w+)</span>', figure)
    assert [name for _, name in legend] == list(RUN_STATUSES)
    assert all(STATUS_COLORS[name] == c for c, name in legend)
    assert STATUS_COLORS["succeeded"] == "#009E73" and STATUS_COLORS["failed"] == "#D55E00"


def test_receive_time_panels_are_drawn_on_a_receive_time_axis() -> None:
    report, _ = _report()
    by_title: dict[str, PanelResult] = {r.panel.title: r for r in report.results}
    dead = by_title["Dead letters per minute by reason"]
    runs = by_title["Runs by status"]
    assert dead.time_range is not None and runs.time_range is not None
    # each axis covers its own clock's data, not the union of both (three days wide)
    assert dead.time_range.start <= RECEIVED < RECEIVED + timedelta(hours=2) <= dead.time_range.end
    assert dead.time_range.end - dead.time_range.start < timedelta(hours=3)
    assert runs.time_range.end < RECEIVED
    figure = _figure(report.html, "Dead letters per minute by reason")
    assert "x axis: receive time" in figure and "by receive time" in figure
    xs = [float(x) for x in re.findall(r'<circle class="mark"[^>]*cx="([\d.]+)"', figure)]
    xs += [
        float(x)
        for pts in re.findall(r'<polyline class="mark"[^>]*points="([^"]+)"', figure)
        for x in re.findall(r"([\d.]+),", pts)
    ]
    width = float(re.search(r'viewBox="0 0 (\d+)', figure).group(1))  # type: ignore[union-attr]
    assert xs and min(xs) < width * 0.3, f"the dead letters crowd the right edge: {xs}"
    assert "x axis: event time" in _figure(report.html, "Runs by status")


def test_a_stack_of_many_series_shows_the_top_eight_and_other() -> None:
    from prism.pipeline.report._data import fold_series

    t0 = EVENT_DAY
    many = [Series(f"tenant-{i:02d} / m", [(t0, float(i + 1))]) for i in range(28)]
    folded = fold_series(many)
    assert [s.name for s in folded[:8]] == [f"tenant-{i:02d} / m" for i in range(27, 19, -1)]
    assert folded[-1].name == "other" and len(folded) == 9
    assert sum(v for s in folded for _, v in s.points) == sum(range(1, 29))
    assert fold_series(many[:9]) == many[:9]  # nine fit: nothing folded


def test_the_report_page_folds_a_stack_the_query_left_wide() -> None:
    from prism.dashboards import report_panels
    from prism.pipeline.report._html import render_page
    from tests.unit.test_report_render import _meta

    panel = next(p for p in report_panels() if p.title == "Billable tokens by tenant and model")
    rows = [(EVENT_DAY, f"tenant-{i:02d} / m", i + 1) for i in range(28)]
    result = PanelResult(panel, columns=["time", "label", "tokens"], rows=rows)
    html = render_page(_meta(), [result])
    legend = re.findall(r'<span style="--c:(#[0-9A-Fa-f]{6})">([^<]+)</span>', html)
    assert len(legend) == 9 and legend[-1] == (OTHER_COLOR, "other"), legend
