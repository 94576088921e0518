"""The budgets file: what it accepts, how it names mistakes, and calendar periods in a zone."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from prism.pipeline.budgets import BudgetConfigError, period_bounds, read_budgets
from prism.pipeline.budgets._period import from_us, to_us

GOOD = """
[[budgets]]
name = "acme-monthly"
scope = { tenant = "acme" }
currency = "USD"
period = "month"
timezone = "Europe/Berlin"
amount = "1000.00"
thresholds = { percent = [50, "80%", 100], absolute = ["900"] }

[[budgets]]
name = "acme-bot-daily"
scope = { tenant = "acme", agent = "support bot;v2" }
currency = "EUR"
period = "day"
timezone = "UTC"
amount = 25

[[rates]]
from = "USD"
to = "EUR"
rate = "0.9"
valid_from = 2026-11-01

[[rates]]
from = "USD"
to = "EUR"
rate = "0.95"
valid_from = 2026-11-15
"""


def write(tmp_path: Path, text: str, name: str = "budgets.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def us(text: str) -> int:
    return to_us(datetime.fromisoformat(text))


def test_a_good_file_reads_with_stable_scope_ids_thresholds_and_dated_rates(
    tmp_path: Path,
) -> None:
    budgets = read_budgets(write(tmp_path, GOOD))
    monthly, daily = budgets.budgets
    assert monthly.scope_id == "tenant=acme"
    assert daily.scope_id == "tenant=acme;agent=support%20bot%3Bv2"
    assert monthly.threshold_amounts() == [
        ("50%", Decimal(500)),
        ("80%", Decimal(800)),
        ("900", Decimal(900)),
        ("100%", Decimal(1000)),
    ]
    assert daily.threshold_amounts() == [("100%", Decimal(25))]  # the default threshold
    assert budgets.rate("USD", "EUR", us("2026-10-31T23:59:59+00:00")) is None
    assert budgets.rate("USD", "EUR", us("2026-11-14T12:00:00+00:00")) == Decimal("0.9")
    assert budgets.rate("USD", "EUR", us("2026-11-15T00:00:00+00:00")) == Decimal("0.95")
    assert budgets.rate("EUR", "USD", us("2026-11-20T00:00:00+00:00")) is None  # not inverted


def test_yaml_reads_the_same_as_toml(tmp_path: Path) -> None:
    yaml_text = """
budgets:
  - name: acme-monthly
    scope: {tenant: acme}
    currency: USD
    period: month
    timezone: Europe/Berlin
    amount: "1000.00"
    thresholds: {percent: [50, 80, 100], absolute: ["900"]}
"""
    from_yaml = read_budgets(write(tmp_path, yaml_text, "b.yaml")).budgets[0]
    assert from_yaml == read_budgets(write(tmp_path, GOOD)).budgets[0]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (('timezone = "UTC"', 'timezone = "Europe/Berln"'), "timezone 'Europe/Berln' is not"),
        (('period = "day"', 'period = "fortnight"'), "period: Input should be 'day'"),
        (('currency = "EUR"', 'currency = "euro"'), "currency: String should match"),
        (("amount = 25", "amount = -5"), "amount must be > 0 and < 10^15, got -5"),
        (('tenant = "acme", agent', 'agent = "x", team'), "scope.tenant: Field required"),
        (('name = "acme-bot-daily"', 'name = "acme-bot-daily"\nowner = "x"'), "owner: Extra"),
        (('absolute = ["900"]', 'absolute = ["nine"]'), "absolute threshold 'nine' is not a"),
    ],
)
def test_a_mistake_names_the_file_the_budget_and_the_value(
    tmp_path: Path, change: tuple[str, str], expected: str
) -> None:
    path = write(tmp_path, GOOD.replace(*change, 1))
    with pytest.raises(BudgetConfigError) as info:
        read_budgets(path)
    text = str(info.value)
    assert str(path) in text
    assert "budget '" in text
    assert expected in text


def test_a_bad_rate_is_named_by_its_position(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace('rate = "0.95"', 'rate = "0"'))
    with pytest.raises(BudgetConfigError, match=r"rate #2, rate: rate must be > 0"):
        read_budgets(path)


def test_two_budgets_of_one_scope_are_refused_by_name(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace(', agent = "support bot;v2"', ""))
    with pytest.raises(BudgetConfigError, match="'acme-monthly' and 'acme-bot-daily' have"):
        read_budgets(path)


def test_unreadable_and_unknown_files_say_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(BudgetConfigError, match="cannot read the budgets file"):
        read_budgets(tmp_path / "missing.toml")
    with pytest.raises(BudgetConfigError, match=r"ends in \.toml, \.yaml or \.yml"):
        read_budgets(write(tmp_path, GOOD, "budgets.ini"))
    with pytest.raises(BudgetConfigError, match="not valid TOML"):
        read_budgets(write(tmp_path, "[[budgets]\n"))


def iso(us_: int, tz: str) -> str:
    return from_us(us_).astimezone(ZoneInfo(tz)).isoformat()


@pytest.mark.parametrize(
    ("period", "tz", "at", "start", "end"),
    [
        # a day across the spring-forward change is 23 hours long
        ("day", "Europe/Berlin", "2026-03-29T12:00:00+02:00",
         "2026-03-29T00:00:00+01:00", "2026-03-30T00:00:00+02:00"),
        # an instant just before local midnight belongs to the day it is in there
        ("day", "America/New_York", "2026-11-20T04:59:00+00:00",
         "2026-11-19T00:00:00-05:00", "2026-11-20T00:00:00-05:00"),
        # ISO weeks start on Monday
        ("week", "Asia/Tokyo", "2026-11-22T23:30:00+09:00",
         "2026-11-16T00:00:00+09:00", "2026-11-23T00:00:00+09:00"),
        # December's month ends in January of the next year
        ("month", "Europe/Berlin", "2026-12-31T23:30:00+01:00",
         "2026-12-01T00:00:00+01:00", "2027-01-01T00:00:00+01:00"),
        # a month across the autumn change
        ("month", "Europe/Berlin", "2026-10-31T23:59:59+01:00",
         "2026-10-01T00:00:00+02:00", "2026-11-01T00:00:00+01:00"),
    ],
)  # fmt: skip
def test_periods_are_calendar_aligned_in_the_zone(
    period: str, tz: str, at: str, start: str, end: str
) -> None:
    lo, hi = period_bounds(period, ZoneInfo(tz), us(at))
    assert (iso(lo, tz), iso(hi, tz)) == (start, end)
    assert lo <= us(at) < hi
    assert period_bounds(period, ZoneInfo(tz), hi)[0] == hi  # the next one starts at the end
    assert period_bounds(period, ZoneInfo(tz), lo) == (lo, hi)


def test_a_day_in_utc_is_the_utc_day() -> None:
    lo, hi = period_bounds("day", ZoneInfo("UTC"), us("2026-11-20T13:00:00+00:00"))
    assert from_us(lo) == datetime(2026, 11, 20, tzinfo=UTC)
    assert hi - lo == 86400 * 1_000_000


def test_the_package_exports_exactly_its_public_names() -> None:
    import types

    import prism.pipeline.budgets as package

    public = {
        name
        for name, value in vars(package).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert sorted(public) == sorted(package.__all__)
