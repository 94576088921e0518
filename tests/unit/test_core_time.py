"""The core's microsecond clock: ``to_us`` and ``from_us`` are exact inverses everywhere, and
``iso_us`` writes exactly what ``from_us(us).isoformat()`` writes."""

from __future__ import annotations

from datetime import UTC, datetime

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


def test_iso_us_edges_and_a_full_cache(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(_run, "_ISO_SECONDS_MAX", 3)
    monkeypatch.setattr(_run, "_ISO_SECONDS", {})
    assert iso_us(0) == "1970-01-01T00:00:00+00:00"  # no fraction, as isoformat
    assert iso_us(-1) == "1969-12-31T23:59:59.999999+00:00"
    assert iso_us(1_000_001) == "1970-01-01T00:00:01.000001+00:00"
    for second in range(10):  # past the bound: the cache starts over, the text stays exact
        us = 1_764_556_800_000_000 + second * 1_000_000 + 5
        assert iso_us(us) == from_us(us).isoformat()
        assert len(_run._ISO_SECONDS) <= 3
