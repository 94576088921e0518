"""The core's microsecond clock: ``to_us`` and ``from_us`` are exact inverses everywhere, and
``iso_us`` writes exactly what ``from_us(us).isoformat()`` writes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from prism.pipeline.core import _run
from prism.pipeline.core._run import from_us, iso_us, to_us


@given(st.datetimes(timezones=st.just(UTC)))
def test_from_us_inverts_to_us_over_the_whole_calendar(ts: datetime) -> None:
    back = from_us(to_us(ts))
    assert back == ts
    assert back.tzinfo is UTC


def test_known_instants() -> None:
    assert from_us(0) == datetime(1970, 1, 1, tzinfo=UTC)
    assert from_us(-1) == datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
    assert from_us(1_764_556_800_123_456) == datetime(2025, 12, 1, 2, 40, 0, 123456, tzinfo=UTC)


@given(st.datetimes(timezones=st.just(UTC)))
def test_iso_us_is_isoformat_over_the_whole_calendar(ts: datetime) -> None:
    us = to_us(ts)
    assert iso_us(us) == from_us(us).isoformat() == ts.isoformat()


def test_iso_us_edges() -> None:
    assert iso_us(0) == "1970-01-01T00:00:00+00:00"  # no fraction, as isoformat
    assert iso_us(-1) == "1969-12-31T23:59:59.999999+00:00"
    assert iso_us(1_000_001) == "1970-01-01T00:00:01.000001+00:00"
    assert iso_us(86_399_000_010) == "1970-01-01T23:59:59.000010+00:00"
    assert iso_us(-86_400_000_000) == "1969-12-31T00:00:00+00:00"


def test_full_caches_start_over_and_stay_exact() -> None:
    # the bounds are Final (the compiled core reads them as constants): go past them
    start = 1_764_556_800_000_000
    for day in range(_run._DAYS_MAX + 10):
        us = start + day * 86_400_000_000 + day * 3_661_000_007
        assert iso_us(us) == _reference(us).isoformat() == from_us(us).isoformat()
        assert len(_run._DAYS) <= _run._DAYS_MAX
    for i in range(_run._DATETIMES_MAX + 10):
        us = start + i * 1_000_003
        first = from_us(us)
        assert first == _reference(us) and first.tzinfo is UTC
        assert from_us(us) is first  # shared while cached
        assert len(_run._DATETIMES) <= _run._DATETIMES_MAX


def _reference(us: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=us)
