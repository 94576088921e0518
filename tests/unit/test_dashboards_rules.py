"""Readability rules of the dashboards, checked on the generated JSON and by the lint:
money per currency, one colour per run status, the clock of each time axis, top N stacks."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from prism.dashboards import (
    DASHBOARDS,
    OKABE_ITO,
    OTHER_COLOR,
    RUN_STATUSES,
    STATUS_COLORS,
    dashboard_json,
    lint_dashboard,
)

BUILT = {b.__name__: dashboard_json(b(None)) for b in DASHBOARDS}
CONTRACT = Path(__file__).resolve().parents[2] / "schemas" / "CONTRACT.md"


def _panel(dash: str, title: str) -> dict[str, Any]:
    return next(p for p in BUILT[dash]["panels"] if p.get("title") == title)


def _lint_after(dash: str, title: str, mutate: Callable[[dict[str, Any]], None]) -> list[str]:
    data = copy.deepcopy(BUILT[dash])
    mutate(next(p for p in data["panels"] if p.get("title") == title))
    return lint_dashboard(data)


def _sql(panel: dict[str, Any], old: str, new: str) -> None:
    target = panel["targets"][0]
    assert old in target["rawSql"], target["rawSql"]
    target["rawSql"] = target["rawSql"].replace(old, new)


# -- money ------------------------------------------------------------------------------


def test_every_panel_summing_cost_shows_one_currency_or_groups_by_it() -> None:
    seen = 0
    for dash in BUILT.values():
        for panel in dash["panels"]:
            for target in panel.get("targets") or []:
                if not re.search(r"sum\w*\(\s*(\w+\.)?cost\b", target["rawSql"]):
                    continue
                seen += 1
                if panel["type"] == "timeseries" or panel.get("repeat"):
                    assert panel.get("repeat") == "currency", panel["title"]
                    assert "${currency:percentencode}" in target["rawSql"], panel["title"]
                    assert "$currency" in panel["title"]
                else:
                    assert re.search(r"GROUP BY[^\n]*currency", target["rawSql"]), panel["title"]
    assert seen >= 8


@pytest.mark.parametrize(
    ("title", "mutate", "expected"),
    [
        (
            "Reported cost by tenant and model ($currency)",
            lambda p: p.pop("repeat"),
            "plots cost of several currencies on one axis",
        ),
        (
            "Top 20 most expensive runs",
            lambda p: _sql(
                p, "ORDER BY currency, reported_cost DESC", "ORDER BY reported_cost DESC"
            ),
            "ranks cost across currencies",
        ),
        (
            "Top 20 most expensive runs",
            lambda p: _sql(p, "LIMIT 20 BY currency", "LIMIT 20"),
            "must be LIMIT n BY currency",
        ),
        (
            "Billable usage by tenant and model",
            lambda p: _sql(
                p, "GROUP BY tenant, provider, model, currency", "GROUP BY tenant, model"
            ),
            "sums cost without grouping by currency",
        ),
    ],
)
def test_lint_refuses_money_added_or_ranked_across_currencies(
    title: str, mutate: Callable[[dict[str, Any]], None], expected: str
) -> None:
    problems = _lint_after("cost_and_usage", title, mutate)
    assert any(expected in p for p in problems), problems


# -- run status colours -----------------------------------------------------------------


def test_the_status_colours_are_okabe_ito_and_cover_every_status_of_the_contract() -> None:
    rule = re.search(r"9\. \*\*Run record\.\*\*(.*?)\n\d+\. ", CONTRACT.read_text(), re.S)
    assert rule, "CONTRACT.md rule 9 moved"
    head = rule.group(1).split("agent_finished")[0]
    assert set(re.findall(r"`(\w+)`", head)) - {"status"} == set(RUN_STATUSES)
    assert set(STATUS_COLORS.values()) <= set(OKABE_ITO.values())
    assert len(set(STATUS_COLORS.values())) == len(STATUS_COLORS)
    assert (STATUS_COLORS["succeeded"], STATUS_COLORS["failed"]) == ("#009E73", "#D55E00")


@pytest.mark.parametrize("dash", ["sre_overview", "report_dashboard"])
def test_runs_by_status_has_a_fixed_colour_override_per_status_in_legend_order(dash: str) -> None:
    panel = _panel(dash, "Runs by status")
    colours = {
        o["matcher"]["options"]: p["value"]
        for o in panel["fieldConfig"]["overrides"]
        if o["matcher"]["id"] == "byName"
        for p in o["properties"]
        if p["id"] == "color"
    }
    assert colours == {s: {"mode": "fixed", "fixedColor": c} for s, c in STATUS_COLORS.items()}
    # one column per status, named as the override matches, in the one legend order
    columns = re.findall(r"countIf\(status = '(\w+)'\) AS (\w+)", panel["targets"][0]["rawSql"])
    assert [c for c, _ in columns] == [a for _, a in columns] == list(RUN_STATUSES)


# -- time axes --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dash", "title", "clock"),
    [
        ("sre_overview", "Dead letters per minute by reason", "receive time"),
        ("sre_overview", "Quarantine per minute by reason", "receive time"),
        ("sre_overview", "Ingest lag (received_at - ts)", "receive time"),
        ("pipeline", "Dead letters by reason", "receive time"),
        ("pipeline", "Consumer lag by source partition", "receive time"),
        ("sre_overview", "Runs by status", "event time"),
    ],
)
def test_each_time_series_says_which_clock_it_plots(dash: str, title: str, clock: str) -> None:
    assert f"by {clock}" in _panel(dash, title)["description"]


def test_lint_refuses_a_time_series_that_hides_or_mixes_its_clock() -> None:
    def strip_note(p: dict[str, Any]) -> None:
        p["description"] = p["description"].split(" Plotted by")[0]

    problems = _lint_after("sre_overview", "Dead letters per minute by reason", strip_note)
    assert any("do not say 'by receive time'" in p for p in problems), problems

    def add_event_time_target(p: dict[str, Any]) -> None:
        extra = copy.deepcopy(p["targets"][0])
        extra["refId"] = "B"
        extra["rawSql"] = extra["rawSql"].replace(
            "$__timeInterval(received_at)", "$__timeInterval(ts)"
        )
        p["targets"].append(extra)

    problems = _lint_after("sre_overview", "Ingest lag (received_at - ts)", add_event_time_target)
    assert any("both event time and receive time" in p for p in problems), problems


# -- stacks -----------------------------------------------------------------------------


def test_lint_refuses_a_stack_of_unbounded_series() -> None:
    wide = """SELECT $__timeInterval(ts) AS time, tool, count() AS calls
FROM tool_calls WHERE $__timeFilter(ts)
GROUP BY time, tool
ORDER BY time, tool"""
    problems = _lint_after(
        "tools", "Tool calls by tool", lambda p: p["targets"][0].update(rawSql=wide)
    )
    assert any("stacks one series per tool with no limit" in p for p in problems), problems


def test_stacks_of_tenants_models_tools_and_agents_fold_past_the_top_eight() -> None:
    for dash, title in [
        ("cost_and_usage", "Billable tokens by tenant and model"),
        ("cost_and_usage", "Reported cost by tenant and model ($currency)"),
        ("cache_efficiency", "Cache write tokens by provider / model"),
        ("tools", "Tool calls by tool"),
        ("tools", "Narrowing clamps by agent"),
    ]:
        panel = _panel(dash, title)
        sql = panel["targets"][0]["rawSql"]
        assert "if(place <= 8, series, 'other')" in sql, title
        grey = [
            o["matcher"]
            for o in panel["fieldConfig"]["overrides"]
            if o["properties"]
            == [{"id": "color", "value": {"mode": "fixed", "fixedColor": OTHER_COLOR}}]
        ]
        # Grafana names the series '<value column> other'
        assert [m["id"] for m in grey] == ["byRegexp"], title
        pattern = re.compile(grey[0]["options"])
        assert pattern.match("tokens other") and pattern.match("other"), title
        assert not pattern.match("acme / brother"), title


def test_the_clock_of_a_panel_does_not_depend_on_the_database_it_is_built_for() -> None:
    for build in DASHBOARDS:
        assert lint_dashboard(dashboard_json(build("t_other_db"))) == [], build.__name__
