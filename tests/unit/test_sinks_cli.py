"""Output of ``prism-pipeline query`` / ``billing`` (table, csv, json) and their arguments."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, date, datetime
from decimal import Decimal

import pytest

from prism.pipeline.cli import build_parser
from prism.pipeline.commands.query import render

COLUMNS = ["tenant_id", "cost", "at", "tokens"]
ROWS = [
    ("acme", Decimal("0.123456789012"), datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC), 10),
    (None, None, None, 0),
]


def test_table_aligns_columns_and_shows_null() -> None:
    lines = render(COLUMNS, ROWS, "table").splitlines()
    assert lines[0].split() == COLUMNS
    assert lines[2].split() == ["acme", "0.123456789012", "2025-01-02T03:04:05+00:00", "10"]
    assert lines[3].split() == ["NULL", "NULL", "NULL", "0"]
    assert lines[-1] == "(2 rows)"


def test_csv_has_a_header_and_empty_nulls() -> None:
    rows = list(csv.reader(io.StringIO(render(COLUMNS, ROWS, "csv"))))
    assert rows == [
        COLUMNS,
        ["acme", "0.123456789012", "2025-01-02T03:04:05+00:00", "10"],
        ["", "", "", "0"],
    ]


def test_json_keeps_decimal_exact_and_null_as_null() -> None:
    objects = json.loads(render(COLUMNS, ROWS, "json"))
    assert objects[0]["cost"] == "0.123456789012"
    assert objects[1] == {"tenant_id": None, "cost": None, "at": None, "tokens": 0}


def test_billing_arguments() -> None:
    parser = build_parser()
    args = parser.parse_args(["billing", "--from", "2025-01-01", "--to", "2025-02-01T00:00:00Z"])
    assert args.start == date(2025, 1, 1)
    assert args.end == datetime(2025, 2, 1, tzinfo=UTC)
    assert args.format == "table" and args.tenant is None


def test_billing_rejects_a_bad_date(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["billing", "--from", "last week", "--to", "2025-02-01"])
    assert "'last week' is not a date" in capsys.readouterr().err


def test_billing_group_by_and_formats_parse() -> None:
    parser = build_parser()
    args = parser.parse_args(["billing", "--from", "2025-01-01", "--to", "2025-02-01",
                              "--group-by", "agent, month", "--format", "parquet",
                              "--out", "bill.parquet"])  # fmt: skip
    assert args.group_by == ("agent", "month") and args.format == "parquet"
    assert parser.parse_args(["invoice", "--month", "2026-11"]).format == "table"
    assert parser.parse_args(["prices", "load", "p.yaml", "--check"]).check is True


@pytest.mark.parametrize(
    ("value", "message"),
    [("agent,week", "cannot group by 'week'"), ("agent,agent", "names a dimension twice")],
)
def test_billing_rejects_a_bad_group_by(
    value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["billing", "--from", "2025-01-01", "--to", "2025-02-01",
                                   "--group-by", value])  # fmt: skip
    assert message in capsys.readouterr().err


def test_human_table_separates_thousands_and_rounds_money_to_six_decimals() -> None:
    rows = [("acme", 1234567, Decimal("12.3456785")), ("globex", 5, None)]
    lines = render(["tenant", "tokens", "cost"], rows, "table", human=True).splitlines()
    assert lines[2].split() == ["acme", "1,234,567", "12.345678"]  # half-even at the 7th
    assert lines[3].endswith("   5       NULL")  # numbers are right-aligned
    assert render(["c"], [(Decimal("0.000000000001"),)], "csv") == "c\n0.000000000001"


def test_vertical_prints_one_block_per_row() -> None:
    text = render(["tenant_id", "n"], [("acme", 3), ("globex", None)], "vertical")
    assert text.splitlines() == [
        "Row 1:", "------", "tenant_id: acme", "        n: 3", "",
        "Row 2:", "------", "tenant_id: globex", "        n: NULL", "", "(2 rows)",
    ]  # fmt: skip
