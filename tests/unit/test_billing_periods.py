"""How ``billing``, ``invoice`` and ``report`` read a period, and what their help shows."""

from __future__ import annotations

import argparse
from datetime import UTC, date, datetime

import pytest

from prism.pipeline.cli import build_parser, main
from prism.sinks import LedgerConfigError
from prism.sinks._invoice import resolve_month

NOW = datetime(2026, 12, 3, 12, 57, 30, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-30", date(2026, 11, 30)),  # billing_report reads it as its midnight UTC
        ("2026-11-30T12:00:00Z", datetime(2026, 11, 30, 12, tzinfo=UTC)),
        ("2026-11-30T12:00:00", datetime(2026, 11, 30, 12, tzinfo=UTC)),
        ("2026-11-30T13:00:00+01:00", datetime(2026, 11, 30, 12, tzinfo=UTC)),
        ("now", NOW),
        ("today", datetime(2026, 12, 3, tzinfo=UTC)),
        ("-7d", datetime(2026, 11, 26, 12, 57, 30, tzinfo=UTC)),
        ("-12h", datetime(2026, 12, 3, 0, 57, 30, tzinfo=UTC)),
        ("-30m", datetime(2026, 12, 3, 12, 27, 30, tzinfo=UTC)),
        ("-2w", datetime(2026, 11, 19, 12, 57, 30, tzinfo=UTC)),
    ],
)
def test_when_reads_dates_times_and_spans_back_from_now(
    text: str, expected: date | datetime
) -> None:
    from prism.pipeline.commands.billing import when

    assert when(text, NOW) == expected


@pytest.mark.parametrize("text", ["yesterday", "-7", "7d", "-7y", "2026-13-01"])
def test_when_refuses_what_it_cannot_read(text: str) -> None:
    from prism.pipeline.commands.billing import when

    with pytest.raises(argparse.ArgumentTypeError, match="-30m, -12h, -7d, -2w"):
        when(text, NOW)


@pytest.mark.parametrize("command", ["billing", "report"])
def test_a_span_back_is_a_value_not_an_option(command: str) -> None:
    args = build_parser().parse_args([command, "--from", "-7d", "--to", "now"])
    assert args.start < args.end <= datetime.now(UTC)


@pytest.mark.parametrize(
    ("text", "today", "month"),
    [
        ("2026-11", date(2026, 12, 3), "2026-11"),
        ("this", date(2026, 12, 3), "2026-12"),
        ("last", date(2026, 12, 3), "2026-11"),
        ("last", date(2027, 1, 1), "2026-12"),
        ("THIS", datetime(2027, 1, 31, 23, 59, tzinfo=UTC), "2027-01"),
    ],
)
def test_months_by_name(text: str, today: date, month: str) -> None:
    assert resolve_month(text, today) == month


def test_a_bad_month_names_the_forms_accepted() -> None:
    with pytest.raises(LedgerConfigError, match=r"is not YYYY-MM \(e.g. 2026-11\), this or last"):
        resolve_month("2026-13")


@pytest.mark.parametrize("command", ["billing", "invoice"])
def test_help_shows_examples(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = capsys.readouterr().out
    examples = text.partition("\nexamples:\n")[2].splitlines()
    assert len(examples) >= 3
    assert all(line.startswith(f"  prism-pipeline {command}") for line in examples)
    if command == "billing":
        assert any("--from -7d" in line for line in examples)
    else:
        assert any("--month last" in line for line in examples)
