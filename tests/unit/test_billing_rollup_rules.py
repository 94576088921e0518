"""When a month's rollup lines may stand for its rows, and how lines of two periods add up."""

from __future__ import annotations

from datetime import date
from decimal import Decimal
from typing import Any

import pytest

from prism.sinks._rollup import _Manifest, _Part, _Table, merge_lines

UUID = "d627a6ae-8062-4299-bced-460b4da048ba"
ENGINE = "ReplacingMergeTree(version) PARTITION BY toYYYYMM(recorded_at) ORDER BY x"
READ = _Manifest("r1", UUID, 3, ((1, 1), (2, 2), (3, 3)), needs_price=False)


def _table(*parts: _Part, engine: str = ENGINE, pid: str = "202611") -> _Table:
    return _Table(UUID, engine, {pid: parts})


@pytest.mark.parametrize(
    ("parts", "holds"),
    [
        ((_Part(1, 1, 1), _Part(2, 2, 2), _Part(3, 3, 3)), True),  # as read
        ((_Part(1, 3, 1),), True),  # merged
        ((_Part(1, 2, 1), _Part(3, 3, 3)), True),  # partly merged
        ((_Part(1, 1, 1), _Part(2, 2, 2), _Part(3, 3, 3), _Part(4, 4, 4)), False),  # insert
        ((_Part(1, 4, 1),), False),  # merged with a new insert
        ((_Part(1, 3, 5),), False),  # mutated
        ((_Part(1, 1, 1), _Part(3, 3, 3)), False),  # a part dropped
        ((_Part(1, 1, 1), _Part(2, 3, 2)), True),
        ((), False),  # every part dropped
    ],
)
def test_lines_stand_for_the_rows_only_while_the_parts_hold_what_was_read(
    parts: tuple[_Part, ...], holds: bool
) -> None:
    assert READ.holds(_table(*parts), parts) is holds


def test_another_table_under_the_same_name_never_matches() -> None:
    parts = (_Part(1, 1, 1), _Part(2, 2, 2), _Part(3, 3, 3))
    other = _Table("00000000-0000-0000-0000-000000000001", ENGINE, {"202611": parts})
    assert not READ.holds(other, parts)


@pytest.mark.parametrize(
    ("engine", "pid", "usable"),
    [
        (ENGINE, "202611", True),
        ("ReplicatedReplacingMergeTree('/t/{shard}', '{replica}', version) ORDER BY x",
         "202611", False),
        (ENGINE + " TTL toDateTime(recorded_at) + toIntervalDay(90)", "202611", False),
        (ENGINE, "patch-0123-202611", False),
    ],
)  # fmt: skip
def test_only_tables_whose_parts_tell_every_change_are_rolled_up(
    engine: str, pid: str, usable: bool
) -> None:
    assert _table(_Part(1, 1, 1), engine=engine, pid=pid).usable is usable


def _line(tenant: str | None, day: date, **figures: Any) -> dict[str, Any]:
    base = {
        "tenant_id": tenant,
        "day": day,
        "kind": "reported",
        "currency": "USD",
        "confidence": None,
        "priced_by": "runtime",
        "rows": 1,
        "input_tokens": None,
        "output_tokens": 5,
        "total_tokens": None,
        "cache_read_tokens": None,
        "cache_write_tokens": None,
        "cost": Decimal("0.000000000001"),
    }
    return base | figures


def test_lines_of_two_periods_add_up_exactly_and_in_the_report_order() -> None:
    d1, d2 = date(2026, 11, 1), date(2026, 11, 2)
    big = Decimal("5000000000000000.000000000001")  # the sum needs 29 digits
    first = [_line("acme", d1, cost=big), _line(None, d1), _line("acme", d2, input_tokens=3)]
    second = [
        _line("acme", d1, cost=big, input_tokens=7),
        _line("acme", d1, currency="EUR", cost=Decimal(1)),
        _line("globex", d2, currency=None, priced_by="unpriced", cost=None),
    ]
    merged = merge_lines([first, second], ["tenant_id", "day"])
    keys = [(m["tenant_id"], m["day"], m["currency"]) for m in merged]
    # NULL last, as ClickHouse orders; EUR and USD never summed together
    assert keys == [
        ("acme", d1, "EUR"),
        ("acme", d1, "USD"),
        ("acme", d2, "USD"),
        ("globex", d2, None),
        (None, d1, "USD"),
    ]
    usd = merged[1]
    assert usd["cost"] == Decimal("10000000000000000.000000000002")
    assert (usd["rows"], usd["input_tokens"], usd["output_tokens"]) == (2, 7, 10)
    assert merged[3]["cost"] is None and merged[3]["input_tokens"] is None
