"""The budgets file: spend budgets per scope, period and currency, and dated conversion rates.

TOML (or YAML, same shape)::

    [[budgets]]
    name = "acme-monthly"
    scope = { tenant = "acme" }          # tenant required; account, user, agent, model optional
    currency = "USD"
    period = "month"                     # day | week (ISO, from Monday) | month
    timezone = "Europe/Berlin"           # IANA; periods start at local midnight
    amount = "1000.00"
    thresholds = { percent = [50, 80, 100], absolute = ["900"] }

    [[rates]]                            # EUR spend counts in USD budgets from 2026-11-01 on
    from = "EUR"
    to = "USD"
    rate = "1.08"
    valid_from = 2026-11-01              # a date: from its midnight UTC

``read_budgets`` checks every value and raises ``BudgetConfigError`` naming the file, the
budget and the bad value. Each budget's ``scope_id`` is stable (it keys the
``prism.budget-state`` topic and the alert ids); one budget per scope.
"""

from __future__ import annotations

import re
import tomllib
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ._errors import BudgetConfigError

__all__ = [
    "SCOPE_DIMENSIONS",
    "Budget",
    "BudgetScope",
    "Budgets",
    "Rate",
    "Thresholds",
    "read_budgets",
]

SCOPE_DIMENSIONS = ("tenant", "account", "user", "agent", "model")
_CURRENCY = r"^[A-Z]{3}$"
_MAX_MONEY = Decimal(10) ** 15
_NAME = re.compile(r"^[^\x00-\x1f]{1,128}$")


def _money(value: Any, what: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, str | int | float | Decimal):
        raise ValueError(f"{what} must be a number or a decimal string, got {value!r}")
    try:
        d = Decimal(str(value))
    except ArithmeticError:
        raise ValueError(f"{what} {value!r} is not a number") from None
    if not d.is_finite() or d <= 0 or d >= _MAX_MONEY:
        raise ValueError(f"{what} must be > 0 and < 10^15, got {value!r}")
    return d


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class BudgetScope(_Model):
    """Whose spend a budget counts: a tenant, optionally narrowed to one account, user,
    agent or model (the run's owner and model, as billing groups them)."""

    tenant: str = Field(min_length=1, max_length=256)
    account: str | None = Field(default=None, min_length=1, max_length=256)
    user: str | None = Field(default=None, min_length=1, max_length=256)
    agent: str | None = Field(default=None, min_length=1, max_length=256)
    model: str | None = Field(default=None, min_length=1, max_length=256)

    @property
    def id(self) -> str:
        """The stable scope id: ``tenant=acme;agent=support-bot`` (values percent-encoded,
        dimensions in a fixed order)."""
        return ";".join(f"{d}={quote(v, safe='')}" for d, v in self.items())

    def items(self) -> list[tuple[str, str]]:
        """The set dimensions, in ``SCOPE_DIMENSIONS`` order."""
        return [(d, v) for d in SCOPE_DIMENSIONS if (v := getattr(self, d)) is not None]

    def matches(self, owner: dict[str, str | None]) -> bool:
        """Whether spend of ``owner`` (dimension -> value) falls in this scope."""
        return all(owner.get(d) == v for d, v in self.items())


class Thresholds(_Model):
    """Percent of the amount and absolute amounts; each fires once per period."""

    percent: tuple[Decimal, ...] = ()
    absolute: tuple[Decimal, ...] = ()

    @field_validator("percent", mode="before")
    @classmethod
    def _percent(cls, value: Any) -> tuple[Decimal, ...]:
        items = value if isinstance(value, list | tuple) else [value]
        out = []
        for v in items:
            d = _money(str(v).rstrip("%") if isinstance(v, str) else v, "percent threshold")
            if d > 1000:
                raise ValueError(f"percent threshold must be at most 1000, got {v!r}")
            out.append(d)
        return tuple(sorted(set(out)))

    @field_validator("absolute", mode="before")
    @classmethod
    def _absolute(cls, value: Any) -> tuple[Decimal, ...]:
        items = value if isinstance(value, list | tuple) else [value]
        return tuple(sorted({_money(v, "absolute threshold") for v in items}))


class Budget(_Model):
    """One spend budget: ``amount`` of ``currency`` per calendar ``period`` in ``timezone``."""

    name: str
    scope: BudgetScope
    currency: str = Field(pattern=_CURRENCY)
    period: Literal["day", "week", "month"]
    timezone: str
    amount: Decimal
    thresholds: Thresholds = Thresholds(percent=(Decimal(100),))

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(f"name must be 1..128 printable characters, got {value!r}")
        return value

    @field_validator("timezone")
    @classmethod
    def _tz(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"timezone {value!r} is not an IANA time zone (e.g. UTC, Europe/Berlin, "
                "America/New_York)"
            ) from None
        return value

    @field_validator("amount", mode="before")
    @classmethod
    def _amount(cls, value: Any) -> Decimal:
        return _money(value, "amount")

    @property
    def scope_id(self) -> str:
        return self.scope.id

    @property
    def tz(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    def threshold_amounts(self) -> list[tuple[str, Decimal]]:
        """Each threshold as (label, amount in the budget's currency), lowest first: the
        label is ``80%`` or the absolute amount (``900``)."""
        out = [(f"{_plain(p)}%", self.amount * p / 100) for p in self.thresholds.percent]
        out += [(_plain(a), a) for a in self.thresholds.absolute]
        return sorted(out, key=lambda t: (t[1], t[0]))


class Rate(_Model):
    """``1 from = rate to``, valid from ``valid_from`` (midnight UTC) until the next rate."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    from_: str = Field(alias="from", pattern=_CURRENCY)
    to: str = Field(pattern=_CURRENCY)
    rate: Decimal
    valid_from: date

    @field_validator("rate", mode="before")
    @classmethod
    def _rate(cls, value: Any) -> Decimal:
        return _money(value, "rate")

    @field_validator("valid_from", mode="before")
    @classmethod
    def _day(cls, value: Any) -> Any:
        if isinstance(value, datetime):
            raise ValueError(f"valid_from must be a date (YYYY-MM-DD), got {value.isoformat()}")
        return value

    @property
    def valid_from_us(self) -> int:
        start = datetime(self.valid_from.year, self.valid_from.month, self.valid_from.day)
        return int(start.replace(tzinfo=UTC).timestamp()) * 1_000_000


class Budgets(_Model):
    """Every budget of a file and the dated rates that convert spend into their currencies."""

    budgets: tuple[Budget, ...] = Field(min_length=1)
    rates: tuple[Rate, ...] = ()

    def rate(self, src: str, dst: str, ts_us: int) -> Decimal | None:
        """The rate converting ``src`` into ``dst`` at ``ts_us`` (None: none configured)."""
        best: Rate | None = None
        for r in self.rates:
            usable = r.from_ == src and r.to == dst and r.valid_from_us <= ts_us
            if usable and (best is None or r.valid_from > best.valid_from):
                best = r
        return None if best is None else best.rate


def _plain(d: Decimal) -> str:
    text = format(d.normalize(), "f")
    return text


def read_budgets(path: str | Path) -> Budgets:
    """The budgets of a TOML (``.toml``) or YAML (``.yaml``/``.yml``) file, checked.

    Example::

        budgets = read_budgets("budgets.toml")
        [(b.scope_id, b.amount, b.currency) for b in budgets.budgets]
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise BudgetConfigError(f"{p}: cannot read the budgets file: {exc.strerror}") from None
    raw = _parse(text, p)
    if not isinstance(raw, dict):
        raise BudgetConfigError(f"{p}: expected a table with a `budgets` list, got {raw!r:.60}")
    try:
        budgets = Budgets.model_validate(raw)
    except ValidationError as exc:
        raise BudgetConfigError(_describe(exc, raw, p)) from None
    seen: dict[str, str] = {}
    for b in budgets.budgets:
        if b.scope_id in seen:
            raise BudgetConfigError(
                f"{p}: budgets {seen[b.scope_id]!r} and {b.name!r} have the same scope "
                f"{b.scope_id!r}; one budget per scope (give one of them another scope)"
            )
        seen[b.scope_id] = b.name
    return budgets


def _parse(text: str, p: Path) -> Any:
    suffix = p.suffix.lower()
    if suffix == ".toml":
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise BudgetConfigError(f"{p}: not valid TOML: {exc}") from None
    if suffix in (".yaml", ".yml"):
        import yaml

        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise BudgetConfigError(f"{p}: not valid YAML: {exc}") from None
    raise BudgetConfigError(f"{p}: a budgets file ends in .toml, .yaml or .yml, not {suffix!r}")


def _describe(exc: ValidationError, raw: dict[str, Any], p: Path) -> str:
    """One line per mistake: the file, which budget (by name and position), field, value."""
    lines = []
    for err in exc.errors():
        loc = err["loc"]
        where = ".".join(str(x) for x in loc)
        if len(loc) >= 2 and loc[0] in ("budgets", "rates") and isinstance(loc[1], int):
            items = raw.get(str(loc[0])) or []
            item = items[loc[1]] if loc[1] < len(items) else {}
            field = ".".join(str(x) for x in loc[2:]) or "entry"
            if loc[0] == "budgets":
                name = item.get("name") if isinstance(item, dict) else None
                who = f"budget {name!r} (#{loc[1] + 1})" if name else f"budget #{loc[1] + 1}"
            else:
                who = f"rate #{loc[1] + 1}"
            where = f"{who}, {field}"
        msg = err["msg"].removeprefix("Value error, ")
        value = err.get("input")
        shown = "" if isinstance(value, dict | list) or msg.count(repr(value)) else f" ({value!r})"
        lines.append(f"{p}: {where}: {msg}{shown}")
    return "\n".join(lines)
