"""The budgets panel, its alert rule and the report's budgets row, run on a real chDB ledger
holding the alert rows the budget desk writes (``budget_alert``, as the desk builds them)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from prism.dashboards import (
    BUDGET_PANEL,
    BUDGET_RULE_UID,
    TimeRange,
    Variable,
    alerting_files,
    dashboard_json,
    expand_alert_query,
    expand_query,
    report_panels,
)
from prism.dashboards._cost import cost_and_usage
from prism.pipeline.budgets._records import budget_alert
from prism.pipeline.report._data import PanelResult
from prism.pipeline.report._html import PageMeta, render_page
from prism.schemas import AlertRow
from prism.sinks import migrate
from tests.fixtures import budgets

NOV = datetime(2026, 11, 1, tzinfo=UTC)
DEC = datetime(2026, 12, 1, tzinfo=UTC)
RANGE = TimeRange(NOV, NOV + timedelta(days=10), timedelta(hours=1))


def _us(t: datetime) -> int:
    return int(t.timestamp() * 1_000_000)


def _rows(tmp_path: Path) -> list[AlertRow]:
    monthly, daily = budgets.read(tmp_path / "budgets.toml").budgets
    month = (_us(NOV), _us(DEC))
    day2 = (_us(NOV + timedelta(days=1)), _us(NOV + timedelta(days=2)))
    at = NOV + timedelta(days=3)
    return [
        budget_alert(monthly, "50%", Decimal(500), month, "firing", _us(at), Decimal("512.5")),
        budget_alert(
            monthly,
            "80%",
            Decimal(800),
            month,
            "firing",
            _us(at + timedelta(hours=5)),
            Decimal("801.25"),
        ),
        budget_alert(
            daily,
            "100%",
            Decimal(40),
            day2,
            "firing",
            day2[0] + 3_600_000_000,
            Decimal("41"),
            "top runs: r1 41; top models: m 41",
        ),
        budget_alert(daily, "100%", Decimal(40), day2, "resolved", day2[1], Decimal("41")),
    ]


@pytest.fixture
def ledger(ch_client: Any, ch_database: str, tmp_path: Path) -> Iterator[str]:
    migrate(ch_client, ch_database)
    budgets.store_alerts(ch_client, ch_database, _rows(tmp_path))
    yield ch_database


def _all_tenants() -> list[Variable]:
    return [Variable("tenant", ["$__all"], options=["acme"])]


def _panel_sql(database: str) -> str:
    data = dashboard_json(cost_and_usage(database))
    panel = next(p for p in data["panels"] if p.get("title") == BUDGET_PANEL)
    assert panel["type"] == "table"
    return str(panel["targets"][0]["rawSql"])


def _query(client: Any, sql: str) -> list[dict[str, Any]]:
    result = client.query(sql)
    return [dict(zip(result.column_names, row, strict=True)) for row in result.result_rows]


def test_the_budgets_panel_shows_spend_against_amount_per_scope_and_period(
    ch_client: Any, ledger: str
) -> None:
    sql = expand_query(_panel_sql(ledger), RANGE, _all_tenants())
    rows = _query(ch_client, sql)
    assert [(r["scope"], r["currency"]) for r in rows] == [
        ("tenant=acme;agent=support-bot", "EUR"),
        ("tenant=acme", "USD"),
    ], rows
    bot, acme = rows
    assert acme["amount"] == 1000.0 and acme["spent_at_last_crossing"] == 801.25
    assert acme["used_ratio"] == pytest.approx(0.80125)
    assert acme["thresholds_crossed"] == "50%, 80%"
    assert acme["threshold_amounts"] == "500, 800"
    assert acme["period"] == "open" and bot["period"] == "ended"
    assert bot["amount"] == 40.0 and bot["used_ratio"] == pytest.approx(41 / 40)


def test_the_budgets_panel_is_empty_for_another_tenant(ch_client: Any, ledger: str) -> None:
    tenant = [Variable("tenant", ["umbrella"], options=["acme", "umbrella"])]
    assert _query(ch_client, expand_query(_panel_sql(ledger), RANGE, tenant)) == []


def _rule_sql(database: str) -> tuple[dict[str, Any], str]:
    rules = alerting_files(database=database)["alert-rules.yaml"]["groups"][0]["rules"]
    rule = next(r for r in rules if r["uid"] == BUDGET_RULE_UID)
    return rule, str(rule["data"][0]["model"]["rawSql"])


def test_the_budget_rule_fires_per_open_crossing_and_clears_when_the_period_ends(
    ch_client: Any, ledger: str
) -> None:
    rule, raw = _rule_sql(ledger)
    assert "runbook" in rule["annotations"] and "budgets status" in rule["annotations"]["runbook"]
    window = timedelta(seconds=rule["data"][0]["relativeTimeRange"]["from"])

    def firing(now: datetime) -> set[tuple[str, str]]:
        rows = _query(ch_client, expand_alert_query(raw, TimeRange(now - window, now)))
        return {(r["scope"], r["budget_threshold"]) for r in rows if r["open_crossings"] > 0}

    bot = ("tenant=acme;agent=support-bot", "100%")
    assert firing(NOV + timedelta(hours=12)) == set()
    assert firing(NOV + timedelta(days=1, hours=2)) == {bot}
    assert firing(NOV + timedelta(days=2, hours=1)) == set()  # the day ended: resolved
    assert firing(NOV + timedelta(days=4)) == {("tenant=acme", "50%"), ("tenant=acme", "80%")}


def _meta() -> PageMeta:
    t = datetime(2026, 11, 1, tzinfo=UTC)
    return PageMeta(
        ledger="chdb://x", database="d", start=t, end=t + timedelta(hours=1),
        interval=timedelta(minutes=1), tenants=(), axes={}, generated_at=t, source="s",
    )  # fmt: skip


def test_the_report_has_the_budgets_row_only_when_there_is_budget_data() -> None:
    panel = next(p for p in report_panels() if p.title == BUDGET_PANEL)
    assert panel.row == "Budgets" and panel.optional and panel.kind == "table"
    other = next(p for p in report_panels() if p.title == "Alerts")
    assert not other.optional
    cols = ["scope", "currency", "amount"]
    empty = [PanelResult(panel, columns=cols), PanelResult(other, columns=["ts"])]
    page = render_page(_meta(), empty)
    assert "<h2>Budgets</h2>" not in page and BUDGET_PANEL not in page
    assert "<h2>Alerts</h2>" in page  # a non-optional empty panel still says so
    full = [PanelResult(panel, columns=cols, rows=[("tenant=acme", "USD", 1000.0)]), empty[1]]
    page = render_page(_meta(), full)
    assert "<h2>Budgets</h2>" in page and "tenant=acme" in page
