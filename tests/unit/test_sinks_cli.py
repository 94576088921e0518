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
