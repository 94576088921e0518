"""The price book on a hand-built ledger: a price change inside the period, who priced what.

Reported usage without a cost is priced at the price valid at its event time; a reported
cost is never re-priced; estimates and rows the book does not cover stay unpriced.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, date, datetime
from decimal import ROUND_DOWN, Decimal
from pathlib import Path
from typing import Any

import pytest

from prism.schemas import LedgerBatch
from prism.sinks import (
    LedgerWriter,
    SourceRange,
    billing_report,
    billing_totals,
    invoice,
    load_prices,
    migrate,
    price_book,
    read_price_file,
)
from prism.sinks.testing import run_row, usage_row

pytestmark = pytest.mark.integration

PRICES = """\
# USD per million tokens; input got cheaper on 2025-01-15 at noon
prices:
  - {provider: anthropic, model: claude, token_kind: input, unit_price: "3.00", currency: USD, valid_from: 2025-01-01}
  - {provider: anthropic, model: claude, token_kind: output, unit_price: "15", currency: USD, valid_from: 2025-01-01}
  - {provider: anthropic, model: claude, token_kind: cache_read, unit_price: "0.30", currency: USD, valid_from: 2025-01-01}
  - {provider: anthropic, model: claude, token_kind: cache_write, unit_price: "3.75", currency: USD, valid_from: 2025-01-01}
  - {provider: anthropic, model: claude, token_kind: input, unit_price: "2.00", currency: USD, valid_from: "2025-01-15T12:00:00Z"}
  - {provider: anthropic, model: haiku, token_kind: input, unit_price: "0.80", currency: USD, valid_from: 2025-01-01}
  - {provider: anthropic, model: haiku, token_kind: output, unit_price: "4", currency: USD, valid_from: 2025-01-01}
"""  # noqa: E501

JAN_10 = datetime(2025, 1, 10, 9, tzinfo=UTC)
JAN_15_BEFORE = datetime(2025, 1, 15, 11, 59, 59, 999000, tzinfo=UTC)
JAN_20 = datetime(2025, 1, 20, 9, tzinfo=UTC)


def _u(event_id: str, run_id: str = "r1", **kw: Any) -> Any:
    kw.setdefault("cost", None)
    kw.setdefault("currency", None)
    return usage_row(event_id, run_id, **kw)


USAGE = [
    # priced by the book at the old input price: 700k uncached input, 10k output, cache
    _u("n1", input_tokens=1_000_000, output_tokens=10_000, total_tokens=1_010_000,
       cache_read_tokens=200_000, cache_write_tokens=100_000, recorded_at=JAN_10),
    # the last millisecond before the change: still the old price
    _u("n2", turn=2, input_tokens=1_000, output_tokens=None, total_tokens=None,
       recorded_at=JAN_15_BEFORE),
    # after the change: the new input price; no output tokens, so no output price needed
    _u("n3", turn=3, input_tokens=1_000_000, output_tokens=0, total_tokens=1_000_000,
       recorded_at=JAN_20),
    # a reported cost wins: never re-priced by the book
    _u("r1", turn=4, input_tokens=5, output_tokens=5, cost=Decimal("0.5"), currency="USD",
       recorded_at=JAN_20),
    # the book has no cache_read price for haiku: the row is left unpriced, never half-priced
    _u("h1", "r2", model="haiku", input_tokens=100, output_tokens=10, cache_read_tokens=50,
       recorded_at=JAN_20),
    # a model the book does not know
    _u("x1", "r3", model="unknown", input_tokens=100, recorded_at=JAN_20),
    # before the first price of the book
    _u("old", "r4", input_tokens=100, output_tokens=1,
       recorded_at=datetime(2024, 12, 31, tzinfo=UTC)),
    # a reported row in another currency than the book's: not priced in USD
    _u("eur", "r5", input_tokens=100, output_tokens=1, currency="EUR", recorded_at=JAN_20),
    # estimates are never priced (rule 6)
    _u("e1", "r6", turn=9, estimated=True, confidence="medium", input_tokens=10**6,
       recorded_at=JAN_20),
]  # fmt: skip


def _cost(tokens: int, per_million: str) -> Decimal:
    return (Decimal(tokens) * Decimal(per_million) / 10**6).quantize(
        Decimal("1e-12"), rounding=ROUND_DOWN
    )


N1 = _cost(700_000, "3") + _cost(10_000, "15") + _cost(200_000, "0.30") + _cost(100_000, "3.75")
N2 = _cost(1_000, "3")
N3 = _cost(1_000_000, "2")


def _fill(client: Any, database: str, path: Path) -> str:
    migrate(client, database)
    writer = LedgerWriter(client, database)
    runs = [run_row(f"r{i}", agent_id=f"agent-{i % 2}") for i in range(1, 7)]
    writer.add(LedgerBatch(usage=USAGE, runs=runs), SourceRange("prism.agent-events", 0, 0, 20))
    writer.flush()
    path.write_text(PRICES, encoding="utf-8")
    load_prices(client, database, read_price_file(path), source=str(path))
    return database


@pytest.fixture(scope="module")
def ledger(ch_client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One ledger for the tests that only read it (a migration takes seconds)."""
    database = f"t_price_{uuid.uuid4().hex[:10]}"
    ch_client.command(f"CREATE DATABASE {database}")
    try:
        yield _fill(ch_client, database, tmp_path_factory.mktemp("prices") / "prices.yaml")
    finally:
        ch_client.command(f"DROP DATABASE IF EXISTS {database} SYNC")


@pytest.fixture
def own_ledger(ch_client: Any, ch_database: str, tmp_path: Path) -> str:
    """A ledger a test may change."""
    return _fill(ch_client, ch_database, tmp_path / "prices.yaml")


def _lines(client: Any, db: str, *group_by: str) -> list[tuple[Any, ...]]:
    return [
        (*line.values()[: len(group_by)], line.kind, line.currency, line.priced_by, line.rows,
         line.cost)
        for line in billing_report(client, db, date(2024, 12, 1), date(2025, 2, 1),
                                   group_by=group_by)
    ]  # fmt: skip


def test_price_change_inside_the_period_prices_each_row_at_its_time(
    ch_client: Any, ledger: str
) -> None:
    assert Decimal("2.685") == N1 and Decimal("2") == N3
    by_day = _lines(ch_client, ledger, "day", "model")
    assert by_day == [
        (date(2024, 12, 31), "claude", "reported", None, "unpriced", 1, None),
        (date(2025, 1, 10), "claude", "reported", "USD", "price_book", 1, N1),
        (date(2025, 1, 15), "claude", "reported", "USD", "price_book", 1, N2),
        (date(2025, 1, 20), "claude", "estimated", None, "unpriced", 1, None),
        (date(2025, 1, 20), "claude", "reported", "EUR", "unpriced", 1, None),
        (date(2025, 1, 20), "claude", "reported", "USD", "price_book", 1, N3),
        (date(2025, 1, 20), "claude", "reported", "USD", "runtime", 1, Decimal("0.5")),
        (date(2025, 1, 20), "haiku", "reported", None, "unpriced", 1, None),
        (date(2025, 1, 20), "unknown", "reported", None, "unpriced", 1, None),
    ]


def test_totals_per_currency_keep_who_priced_what(ch_client: Any, ledger: str) -> None:
    lines = billing_report(ch_client, ledger, date(2024, 12, 1), date(2025, 2, 1),
                           group_by=("tenant",))  # fmt: skip
    totals = {(t.kind, t.currency): t for t in billing_totals(lines)}
    usd = totals[("reported", "USD")]
    assert (usd.rows, usd.runtime_rows, usd.price_book_rows, usd.unpriced_rows) == (4, 1, 3, 0)
    assert usd.cost == N1 + N2 + N3 + Decimal("0.5")
    assert totals[("reported", None)].unpriced_rows == 3
    assert totals[("reported", None)].cost is None
    assert totals[("reported", "EUR")].cost is None
    estimated = totals[("estimated", None)]
    assert (estimated.rows, estimated.input_tokens, estimated.cost) == (1, 10**6, None)


def test_reloading_is_idempotent_and_a_corrected_price_wins(
    ch_client: Any, own_ledger: str, tmp_path: Path
) -> None:
    ledger = own_ledger
    path = tmp_path / "prices.yaml"
    again = load_prices(ch_client, ledger, read_price_file(path), source=str(path))
    assert (again.new, again.changed, again.unchanged) == (0, 0, 7)
    assert len(price_book(ch_client, ledger)) == 7
    fixed = tmp_path / "fix.csv"
    fixed.write_text(
        "provider,model,token_kind,unit_price,currency,valid_from,per_tokens\n"
        "anthropic,claude,input,0.0025,USD,2025-01-15T12:00:00Z,1000\n",
        encoding="utf-8",
    )
    loaded = load_prices(ch_client, ledger, read_price_file(fixed), source=str(fixed))
    assert (loaded.new, loaded.changed, loaded.unchanged) == (0, 1, 0)
    (n3,) = [
        line for line in billing_report(ch_client, ledger, JAN_20, date(2025, 1, 21),
                                        group_by=("model", "priced_by_day_guard"[:0] or "day"))
        if line.priced_by == "price_book"
    ]  # fmt: skip
    assert n3.cost == _cost(1_000_000, "2.5")


def test_invoice_lines_reconcile_with_the_ledger(ch_client: Any, ledger: str) -> None:
    inv = invoice(ch_client, ledger, "2025-01")
    assert inv.balanced, inv.reconciliation
    assert sum(line.event_count for line in inv.lines) == 7  # reported rows of January
    by_source = {(line.model, line.currency, line.priced_by): line for line in inv.lines}
    assert by_source[("claude", "USD", "price_book")].cost == N1 + N2 + N3
    assert by_source[("claude", "USD", "runtime")].cost == Decimal("0.5")
    assert by_source[("haiku", None, "unpriced")].cost is None
    assert {(r.figure, r.currency, r.ledger) for r in inv.reconciliation} == {
        ("events", None, 7),
        ("runtime_cost", "USD", Decimal("0.5")),
    }


def test_retracted_usage_is_never_billed(ch_client: Any, own_ledger: str) -> None:
    ledger = own_ledger
    gone = usage_row("r1", "r1", turn=4, input_tokens=5, output_tokens=5, cost=Decimal("0.5"),
                     currency="USD", recorded_at=JAN_20, version=2, retracted=True)  # fmt: skip
    writer = LedgerWriter(ch_client, ledger)
    writer.add(LedgerBatch(usage=[gone]), SourceRange("prism.agent-events", 0, 100, 100))
    writer.flush()
    lines = billing_report(ch_client, ledger, JAN_20, date(2025, 1, 21), group_by=("model",))
    assert "runtime" not in {line.priced_by for line in lines}
    assert invoice(ch_client, ledger, "2025-01").balanced
