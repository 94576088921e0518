"""Price files (YAML, CSV): every row checked, each mistake named by file, line and value."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest

from prism.sinks import PriceBookError, PriceRow, read_price_file


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_yaml_prices_stay_exact_and_dates_are_utc(tmp_path: Path) -> None:
    path = _write(tmp_path, "p.yaml", """\
- provider: openai
  model: gpt-5
  token_kind: cache_read
  unit_price: 0.000000000001
  currency: EUR
  valid_from: 2026-11-01
- {provider: openai, model: gpt-5, token_kind: input, unit_price: 1.10, currency: EUR,
   valid_from: "2026-11-15T13:30:00+01:00", per_tokens: 1000}
""")  # fmt: skip
    first, second = read_price_file(path)
    nov = datetime(2026, 11, 1, tzinfo=UTC)
    assert first == PriceRow("openai", "gpt-5", "cache_read", "EUR", nov, Decimal("1E-12"))
    assert first.line == 1 and second.line == 7
    assert second.unit_price == Decimal("1.10") and second.per_tokens == 1000
    assert second.valid_from == datetime(2026, 11, 15, 12, 30, tzinfo=UTC)


def test_every_mistake_is_named_with_file_line_and_value(tmp_path: Path) -> None:
    path = _write(tmp_path, "p.csv", (
        "provider,model,token_kind,unit_price,currency,valid_from\n"
        "anthropic,claude,input,3.00,USD,2026-11-01\n"
        "anthropic,claude,cached,3.00,usd,2026-11-01\n"
        "anthropic,claude,output,-1,USD,2026-11-01T00:00:00\n"
        "anthropic,,output,1.0000000000001,USD,yesterday\n"
        "anthropic,claude,input,2.00,USD,2026-11-01\n"
    ))  # fmt: skip
    with pytest.raises(PriceBookError) as info:
        read_price_file(path)
    text = str(info.value)
    assert "nothing loaded" in text
    for expected in (
        f"{path}:3: token_kind 'cached' is not one of input, output, cache_read, cache_write",
        f"{path}:3: currency 'usd' is not an ISO 4217 code",
        f"{path}:4: unit_price '-1' is not a decimal number >= 0",
        f"{path}:4: valid_from '2026-11-01T00:00:00' is not a date",
        f"{path}:5: model is missing",
        f"{path}:5: unit_price '1.0000000000001'",
        f"{path}:5: valid_from 'yesterday'",
        f"{path}:6: anthropic/claude input in USD from 2026-11-01T00:00:00+00:00 is already "
        "priced on line 2",
    ):
        assert expected in text, expected


def test_unknown_fields_suffix_and_header_are_refused(tmp_path: Path) -> None:
    bad_field = _write(tmp_path, "p.yml", "prices:\n  - {provider: a, model: b, token_kind: "
                       "input, unit_price: 1, currency: USD, valid_from: 2026-01-01, "
                       "region: eu}\n")  # fmt: skip
    with pytest.raises(PriceBookError, match=r"p\.yml:2: unknown field 'region'"):
        read_price_file(bad_field)
    with pytest.raises(PriceBookError, match=r"suffix '\.json'; use a \.yaml, \.yml or \.csv"):
        read_price_file(_write(tmp_path, "p.json", "[]"))
    with pytest.raises(PriceBookError, match="lacks unit_price, currency"):
        read_price_file(_write(tmp_path, "h.csv", "provider,model,token_kind,valid_from\n"))
    with pytest.raises(PriceBookError, match="holds no price"):
        read_price_file(_write(tmp_path, "e.yaml", "prices: []\n"))
    with pytest.raises(PriceBookError, match="cannot read the price file"):
        read_price_file(tmp_path / "missing.csv")
