"""The report's shaping and drawing, without a ledger: Grafana's long-to-wide step, units, SVG."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from prism.dashboards import ReportPanel, report_panels
from prism.pipeline.report._data import PanelResult, categories, pick_interval, series_of
from prism.pipeline.report._html import PageMeta, render_page
from prism.pipeline.report._svg import bars_svg, format_value, timeseries_svg

T0 = datetime(2026, 11, 30, 0, 0, tzinfo=UTC)


def _panel(kind: str, **kw: object) -> ReportPanel:
    base: dict[str, object] = {
        "row": "Runs",
        "title": "Runs by status",
        "description": "d",
        "kind": kind,
        "unit": "short",
        "targets": ("SELECT 1",),
    }
    base.update(kw)
    return ReportPanel(**base)  # type: ignore[arg-type]


def _meta(**kw: object) -> PageMeta:
    base: dict[str, object] = {
        "ledger": "chdb://./.data/ledger",
        "database": "prism",
        "start": T0,
        "end": T0 + timedelta(hours=1),
        "interval": timedelta(minutes=5),
        "tenants": (),
        "generated_at": T0,
        "source": "prism-report",
    }
    base.update(kw)
    return PageMeta(**base)  # type: ignore[arg-type]


def test_long_rows_become_one_series_per_label_as_in_grafana() -> None:
    naive = T0.replace(tzinfo=None)  # the driver returns naive UTC
    result = PanelResult(
        _panel("timeseries"),
        columns=["time", "status", "runs"],
        rows=[
            (naive, "succeeded", 5),
            (naive, "failed", 2),
            (naive + timedelta(minutes=5), "succeeded", Decimal(7)),
        ],
    )
    series = {s.name: s.points for s in series_of(result)}
    assert series == {
        "succeeded": [(T0, 5.0), (T0 + timedelta(minutes=5), 7.0)],
        "failed": [(T0, 2.0)],
    }


def test_several_value_columns_become_series_named_by_column_and_nulls_are_gaps() -> None:
    result = PanelResult(
        _panel("timeseries"),
        columns=["time", "p50", "p99"],
        rows=[(T0, 1.5, float("nan")), (T0 + timedelta(minutes=5), None, 9.0)],
    )
    assert {s.name: s.points for s in series_of(result)} == {
        "p50": [(T0, 1.5)],
        "p99": [(T0 + timedelta(minutes=5), 9.0)],
    }


def test_bar_categories_come_from_the_text_column() -> None:
    result = PanelResult(
        _panel("barchart"),
        columns=["model", "p50", "p95"],
        rows=[("openai / gpt-4.1", 1.0, 2.0), ("edge / phi-4-mini", 0.5, None)],
    )
    names, groups = categories(result)
    assert names == ["openai / gpt-4.1", "edge / phi-4-mini"]
    assert groups == [("p50", [1.0, 0.5]), ("p95", [2.0, None])]


@pytest.mark.parametrize(
    ("value", "unit", "text"),
    [
        (0.517, "percentunit", "51.7%"),
        (0.25, "s", "250 ms"),
        (62100.0, "s", "17.2 h"),
        (21_300_000, "short", "21.3M"),
        (12.5, "cpm", "12.5/min"),
        (1234567, "short", "1,234,567"),
        (0, "s", "0"),
        (None, "s", "-"),
    ],
)
def test_units_read_like_grafanas(value: float | None, unit: str, text: str) -> None:
    exact = text == "1,234,567"
    assert format_value(value, unit, exact=exact) == text


def test_the_interval_is_round_and_gives_at_most_sixty_buckets() -> None:
    assert pick_interval(T0, T0 + timedelta(hours=3)) == timedelta(minutes=5)
    assert pick_interval(T0, T0 + timedelta(seconds=30)) == timedelta(seconds=1)
    assert pick_interval(T0, T0 + timedelta(days=2)) == timedelta(hours=1)


def test_stacked_bars_stack_and_every_datum_is_a_mark() -> None:
    from prism.pipeline.report._data import Series

    svg = timeseries_svg(
        "t",
        [Series("a", [(T0, 2.0), (T0 + timedelta(minutes=5), 1.0)]), Series("b", [(T0, 3.0)])],
        T0,
        T0 + timedelta(minutes=30),
        timedelta(minutes=5),
        "short",
        bars=True,
    )
    assert svg.count('class="mark"') == 3
    heights = [float(h) for h in re.findall(r'class="mark"[^>]*height="([\d.]+)"', svg)]
    # a (2) and b (3) stacked in the first bucket are five times a's 1 in the second
    assert heights[0] + heights[2] == pytest.approx(5 * heights[1], rel=0.02)
    ys = [float(y) for y in re.findall(r'class="mark"[^>]*? y="([\d.]+)"', svg)]
    assert ys[2] + heights[2] == pytest.approx(ys[0], abs=0.2)  # b sits on top of a


def test_text_from_the_ledger_is_escaped_everywhere() -> None:
    hostile = '<script>alert("x")</script>'
    series = PanelResult(
        _panel("timeseries"), columns=["time", "tenant", "n"], rows=[(T0, hostile, 1)]
    )
    table = PanelResult(
        _panel("table", title="Alerts", row="Alerts"), columns=["message"], rows=[(hostile,)]
    )
    bars = bars_svg("b", [hostile], [("n", [1.0])], "short")
    html = render_page(_meta(tenants=(hostile,)), [series, table])
    assert "<script" not in html and "<script" not in bars
    assert "&lt;script&gt;" in html


def test_a_panel_without_rows_or_with_an_error_says_so() -> None:
    empty = PanelResult(_panel("timeseries"))
    failed = PanelResult(_panel("stat", title="Ingest freshness"), error="Code: 60. no table")
    html = render_page(_meta(), [empty, failed])
    assert 'data-rows="0"' in html and "No data in this time range" in html
    assert 'data-error="Code: 60. no table"' in html and "query failed: Code: 60." in html


def test_the_report_panels_cover_what_a_first_hour_asks() -> None:
    titles = {p.title: p for p in report_panels()}
    for title in (
        "Runs by status",
        "Limit deaths by axis",
        "Billable tokens by tenant and model",
        "Reported cost by tenant and model ($currency)",
        "Hit rate by provider / model",
        "Turn latency p50 / p95 by model",
        "Dead letters per minute by reason",
        "Quarantine per minute by reason",
        "Alerts",
        "Top expensive runs ($currency)",
        "Ingest freshness",
    ):
        assert title in titles
    assert titles["Runs by status"].bars and titles["Runs by status"].stacked
    # the same SQL as the Grafana dashboard the panel comes from
    from prism.dashboards import dashboard_json, sre_overview

    sre = {p["title"]: p for p in dashboard_json(sre_overview())["panels"]}
    assert titles["Runs by status"].targets == tuple(
        t["rawSql"] for t in sre["Runs by status"]["targets"]
    )


def test_an_axis_of_a_minute_or_two_has_ticks_in_seconds() -> None:
    """A replay's receive times can span under two minutes: the axis still has several ticks."""
    from prism.pipeline.report._data import Series

    start = T0 + timedelta(seconds=7)
    svg = timeseries_svg(
        "t", [Series("a", [(start, 1.0)])], start, start + timedelta(seconds=95),
        timedelta(seconds=5), "short",
    )  # fmt: skip
    labels = re.findall(r'text-anchor="middle">([\d:]+)</text>', svg)
    assert len(labels) >= 3 and all(len(x) == 8 for x in labels), labels
