"""The core's microsecond clock: ``to_us`` and ``from_us`` are exact inverses everywhere."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from prism.pipeline.core._run import from_us, to_us


@given(st.datetimes(timezones=st.just(UTC)))
def test_from_us_inverts_to_us_over_the_whole_calendar(ts: datetime) -> None:
    back = from_us(to_us(ts))
    assert back == ts
    assert back.tzinfo is UTC


def test_known_instants() -> None:
    assert from_us(0) == datetime(1970, 1, 1, tzinfo=UTC)
    assert from_us(-1) == datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
    assert from_us(1_764_556_800_123_456) == datetime(2025, 12, 1, 2, 40, 0, 123456, tzinfo=UTC)
