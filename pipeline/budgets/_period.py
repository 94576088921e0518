"""Budget periods: calendar days, ISO weeks (Monday) and months in an IANA time zone.

A period starts at local midnight (of the day, of the week's Monday, of the month's
first) and ends where the next one starts, so a day across a daylight-saving change is
23 or 25 hours long. Times are microseconds since the epoch (UTC), as in the core.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

__all__ = ["PERIODS", "from_us", "period_bounds", "period_start", "to_us"]

PERIODS = ("day", "week", "month")
_US = 1_000_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _local_midnight(day: date, tz: ZoneInfo) -> int:
    """The first instant of ``day`` in ``tz`` (a midnight skipped by a clock change is the
    instant the day's clock starts at), in µs since the epoch."""
    local = datetime(day.year, day.month, day.day, tzinfo=tz)
    return to_us(local)


def to_us(value: datetime) -> int:
    """An aware datetime (a naive one is UTC) as exact µs since the epoch."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    delta = value.astimezone(UTC) - _EPOCH
    return (delta.days * 86400 + delta.seconds) * _US + delta.microseconds


def from_us(us: int) -> datetime:
    """µs since the epoch as an aware UTC datetime (``to_us``'s inverse)."""
    return _EPOCH + timedelta(microseconds=us)


def _first_day(period: str, day: date) -> date:
    if period == "day":
        return day
    if period == "week":
        return day - timedelta(days=day.weekday())
    return day.replace(day=1)


def _next_first_day(period: str, first: date) -> date:
    if period == "day":
        return first + timedelta(days=1)
    if period == "week":
        return first + timedelta(days=7)
    return date(first.year + first.month // 12, first.month % 12 + 1, 1)


def period_bounds(period: str, tz: ZoneInfo, ts_us: int) -> tuple[int, int]:
    """``[start, end)`` in µs of the ``period`` (day, week, month) in ``tz`` holding ``ts_us``.

    Example::

        period_bounds("month", ZoneInfo("Europe/Berlin"), ts)  # Nov 1 00:00+01 .. Dec 1 00:00+01
    """
    if period not in PERIODS:
        raise ValueError(f"period {period!r} is not one of {', '.join(PERIODS)}")
    local = from_us(ts_us)
    first = _first_day(period, local.astimezone(tz).date())
    start = _local_midnight(first, tz)
    if start > ts_us:  # a skipped midnight's clock starts later than the instant: the day before
        first = _first_day(period, first - timedelta(days=1))
        start = _local_midnight(first, tz)
    return start, _local_midnight(_next_first_day(period, first), tz)


def period_start(period: str, tz: ZoneInfo, ts_us: int) -> int:
    """The start (µs) of the period holding ``ts_us``."""
    return period_bounds(period, tz, ts_us)[0]
