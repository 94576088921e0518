"""``budgets status``: the figures from billing lines, and how the command names mistakes."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from prism.pipeline.cli import main
from prism.pipeline.commands.budgets import COLUMNS, status_rows
from prism.sinks import BillingLine
from tests.unit.test_budgets_desk import budgets


def line(day: int, kind: str = "reported", cost: str | None = "1", currency: str | None = "USD",
         agent: str = "bot", **kw: Any) -> BillingLine:  # fmt: skip
    return BillingLine(
        kind=kind, currency=currency, confidence=None, priced_by="runtime", rows=2,
        input_tokens=100, output_tokens=10, total_tokens=None, cache_read_tokens=None,
        cache_write_tokens=None, cost=None if cost is None else Decimal(cost),
        group_by=("tenant", "agent", "day"), tenant_id="acme", agent_id=agent,
        day=date(2026, 11, day), **kw,
    )  # fmt: skip


def test_status_sums_billed_spend_converts_by_the_days_rate_and_forecasts() -> None:
    asked: list[tuple[str, datetime, datetime]] = []

    def lines_of(budget: Any, start: datetime, end: datetime) -> list[BillingLine]:
        asked.append((budget.scope_id, start, end))
        return [
            line(20, cost="3"),
            line(20, cost="2", agent="other"),
            line(20, cost="4", currency="EUR"),  # no EUR->USD rate: unconverted
            line(20, kind="estimated", cost=None, currency=None),
            line(20, cost=None, currency=None),  # unpriced
        ]

    at = datetime(2026, 11, 20, 6, tzinfo=UTC)  # a quarter of the day gone
    rows = [dict(zip(COLUMNS, r, strict=True)) for r in status_rows(budgets(), lines_of, at)]
    day = (datetime(2026, 11, 20, tzinfo=UTC), datetime(2026, 11, 21, tzinfo=UTC))
    assert asked == [("tenant=acme", *day), ("tenant=acme;agent=bot", *day)]
    acme, bot = rows
    assert acme | {"period_start": None} == {
        "budget": "acme-daily", "scope": "tenant=acme", "currency": "USD",
        "period_start": None, "period_end": "2026-11-21T00:00:00+00:00", "amount": "10",
        "spent": "5", "remaining": "5", "used_ratio": "0.5000", "forecast": "20",
        "state": "warning", "thresholds_crossed": "3,50%", "estimated_rows": 2,
        "estimated_input_tokens": 100, "estimated_output_tokens": 10,
        "unconverted": "4 EUR", "unpriced_rows": 2,
    }  # fmt: skip
    # the bot's budget is in EUR: USD counts at 0.5 from 2026-11-20, EUR as it is
    assert (bot["spent"], bot["state"], bot["unconverted"]) == ("5.5", "exceeded", "")


def test_a_bad_budgets_file_is_a_usage_error_naming_the_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "b.toml"
    path.write_text(
        '[[budgets]]\nname = "x"\nscope = {tenant = "t"}\ncurrency = "USD"\n'
        'period = "month"\ntimezone = "Mars/Olympus"\namount = 5\n'
    )
    assert main(["budgets", "status", "--budgets", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: budget 'x' (#1), timezone: timezone 'Mars/Olympus' is not an IANA" in err


def test_help_shows_examples(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["budgets", "status", "--help"])
    assert "prism-pipeline budgets status --budgets budgets.toml" in capsys.readouterr().out
