"""Billing, per-minute cache aggregates and run timelines on hand-built ledger rows (chDB)."""

from __future__ import annotations

import dataclasses
import re
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from prism.schemas import LedgerBatch
from prism.sinks import (
    BillingLine,
    LedgerWriter,
    SourceRange,
    billing_report,
    billing_sql,
    migrate,
    query,
    run_timeline,
)
from prism.sinks.testing import event_row, run_row, turn_row, usage_row

pytestmark = pytest.mark.integration

JAN = datetime(2025, 1, 15, 12, tzinfo=UTC)
BILLING_MD = Path(__file__).parents[2] / "sinks" / "BILLING.md"


@pytest.fixture
def ledger(ch_client: Any, ch_database: str) -> str:
    migrate(ch_client, ch_database)
    return ch_database


def _write(client: Any, db: str, batch: LedgerBatch, first: int = 0) -> None:
    writer = LedgerWriter(client, db)
    writer.add(batch, SourceRange("prism.agent-events", 0, first, first + len(batch)))
    writer.flush()


def _u(event_id: str, run_id: str = "r1", **kw: Any) -> Any:
    kw.setdefault("recorded_at", JAN)
    kw.setdefault("cache_read_tokens", None)
    kw.setdefault("cache_write_tokens", None)
    return usage_row(event_id, run_id, **kw)


def _est(event_id: str, turn: int, confidence: str, **kw: Any) -> Any:
    return _u(event_id, turn=turn, estimated=True, confidence=confidence, cost=None,
              currency=None, **kw)  # fmt: skip


FLEET = [
    _u("u1", turn=1, input_tokens=100, output_tokens=10, total_tokens=110,
       cache_read_tokens=50, cost=Decimal("0.10")),
    _u("u2", turn=2, input_tokens=200, output_tokens=20, total_tokens=220,
       cache_write_tokens=5, cost=Decimal("0.20")),
    _u("u3", scope="run_total", turn=None, attempt=None, input_tokens=300, output_tokens=30,
       total_tokens=330, cost=Decimal("0.30")),
    _est("u4", 3, "low", input_tokens=1000),  # superseded by u5 (recorded in February), below
    _u("u5", turn=3, input_tokens=400, cost=Decimal("0.40"),
       recorded_at=datetime(2025, 2, 1, 0, 0, 1, tzinfo=UTC)),
    _est("u6", 4, "medium", input_tokens=50, output_tokens=5, total_tokens=55),
    _est("u7", 5, "low", input_tokens=7, output_tokens=None, total_tokens=None),
    _u("u8", "r2", model="gpt", provider="openai", input_tokens=10, cost=Decimal("0.01"),
       currency="EUR"),
    _u("u9", "r2", model="gpt", provider="openai", turn=2, input_tokens=20,
       cost=Decimal("0.02"), currency="USD"),
    _u("u10", "r3", tenant_id="globex", input_tokens=1000, cost=Decimal("1.00")),
    _u("u11", "r4", input_tokens=999, cost=Decimal("9.99"),
       recorded_at=datetime(2024, 12, 31, 23, 59, tzinfo=UTC)),
]  # fmt: skip


def _line(line: BillingLine) -> tuple[Any, ...]:
    return (line.tenant_id, line.provider, line.model, line.kind, line.currency,
            line.confidence, line.rows, line.input_tokens, line.output_tokens,
            line.cache_read_tokens, line.cache_write_tokens, line.cost)  # fmt: skip


EXPECTED_JANUARY = [
    ("acme", "anthropic", "claude", "estimated", None, "low", 1, 7, None, None, None, None),
    ("acme", "anthropic", "claude", "estimated", None, "medium", 1, 50, 5, None, None, None),
    ("acme", "anthropic", "claude", "reported", "USD", None, 2, 300, 30, 50, 5, Decimal("0.3")),
    ("acme", "openai", "gpt", "reported", "EUR", None, 1, 10, 20, None, None, Decimal("0.01")),
    ("acme", "openai", "gpt", "reported", "USD", None, 1, 20, 20, None, None, Decimal("0.02")),
    ("globex", "anthropic", "claude", "reported", "USD", None, 1, 1000, 20, None, None,
     Decimal("1")),
]  # fmt: skip


def test_billing_report_on_a_hand_built_ledger(ch_client: Any, ledger: str) -> None:
    _write(ch_client, ledger, LedgerBatch(usage=FLEET))
    _write(ch_client, ledger, LedgerBatch(usage=[FLEET[0]]), first=100)  # redelivered u1
    # the core re-emits u4 once it sees u5 (a report for the same turn): a newer version wins
    u4_superseded = dataclasses.replace(FLEET[3], superseded=True, version=2)
    _write(ch_client, ledger, LedgerBatch(usage=[u4_superseded]), first=200)
    lines = billing_report(ch_client, ledger, date(2025, 1, 1), date(2025, 2, 1))
    assert [_line(x) for x in lines] == EXPECTED_JANUARY

    globex = billing_report(ch_client, ledger, date(2025, 1, 1), date(2025, 2, 1), "globex")
    assert [_line(x) for x in globex] == EXPECTED_JANUARY[-1:]

    february = billing_report(ch_client, ledger, date(2025, 2, 1), date(2025, 3, 1))
    assert [(x.kind, x.input_tokens, x.cost) for x in february] == [
        ("reported", 400, Decimal("0.4"))
    ]


def test_run_total_rows_never_reach_a_billing_total(ch_client: Any, ledger: str) -> None:
    totals = [
        _u(f"t{i}", f"r{i}", scope="run_total", turn=None, attempt=None, input_tokens=10**6,
           cost=Decimal("100"))
        for i in range(3)
    ]  # fmt: skip
    _write(ch_client, ledger, LedgerBatch(usage=totals))
    assert billing_report(ch_client, ledger, date(2025, 1, 1), date(2025, 2, 1)) == []
    _write(ch_client, ledger, LedgerBatch(usage=[_u("p1", "r0", input_tokens=5)]), first=10)
    (line,) = billing_report(ch_client, ledger, date(2025, 1, 1), date(2025, 2, 1))
    assert (line.rows, line.input_tokens, line.cost) == (1, 5, Decimal("0.0012"))


def test_the_documented_billing_sql_matches_the_report(ch_client: Any, ledger: str) -> None:
    no_cost = _u("u12", "r5", turn=7, cost=None, currency=None)  # unpriced: no price book
    _write(ch_client, ledger, LedgerBatch(usage=[*FLEET, no_cost]))
    sql = re.search(r"```sql\n(.*?)```", BILLING_MD.read_text(), re.S)
    assert sql is not None
    rows = ch_client.query(sql[1].replace("prism.", f"{ledger}.")).result_rows
    report = billing_report(ch_client, ledger, date(2025, 1, 1), date(2025, 2, 1))
    assert "unpriced" in {x.priced_by for x in report if x.kind == "reported"}
    # with an empty price book the report runs a leaner query: the full one agrees
    params = {"start": "2025-01-01 00:00:00.000", "end": "2025-02-01 00:00:00.000"}
    full = ch_client.query(billing_sql(ledger, price_book=True), parameters=params)
    assert [BillingLine(**r).values() for r in full.named_results()] == [x.values() for x in report]
    assert [
        (r[0], r[1], r[2], r[3], r[4], r[5], r[7], r[8], r[9], r[11], r[12], r[13], r[6])
        for r in rows
    ] == [(*_line(x), x.priced_by) for x in report]


def test_cache_hits_weight_by_tokens_over_current_turns(ch_client: Any, ledger: str) -> None:
    minute = datetime(2025, 1, 15, 12, 1, tzinfo=UTC)
    later = minute + timedelta(minutes=1)
    rows = [
        turn_row("r1", 1, ts=minute, input_tokens=100, cache_read_tokens=90),
        turn_row("r1", 2, ts=minute + timedelta(seconds=5), input_tokens=200),
        turn_row("r2", 1, ts=minute + timedelta(seconds=9), input_tokens=900,
                 cache_read_tokens=90),
        turn_row("r2", 2, ts=later, input_tokens=40),
        # a post-terminal turn written, then retracted: it leaves the aggregate
        turn_row("r3", 1, ts=minute, input_tokens=5000, cache_read_tokens=5000),
    ]  # fmt: skip
    _write(ch_client, ledger, LedgerBatch(turns=rows))
    gone = turn_row("r3", 1, ts=minute, version=2, retracted=True)
    _write(ch_client, ledger, LedgerBatch(turns=[gone]), first=10)
    got = ch_client.query(
        f"SELECT minute, turns, turns_reporting_cache, turns_not_reporting_cache, input_tokens, "
        f"cache_read_tokens, cache_hit_rate FROM {ledger}.cache_hits_1m ORDER BY minute"
    ).result_rows
    # 180 cached of the 1000 input tokens of reporting turns: 0.18, not the mean (0.9+0.1)/2
    assert [r[1:] for r in got] == [(3, 2, 1, 1200, 180, pytest.approx(0.18)),
                                   (1, 0, 1, 40, 0, None)]  # fmt: skip


def test_run_timeline_orders_turns_and_events(ch_client: Any, ledger: str) -> None:
    batch = LedgerBatch(
        runs=[run_row("r1", status="failed", version=3)],
        turns=[
            turn_row("r1", 2, seq=4),
            turn_row("r1", 1, seq=2),
            turn_row("r1", 1, kind="deterministic", attempt=0, seq=1),
        ],
        usage=[usage_row("u2", "r1", seq=5, turn=2), usage_row("u1", "r1", seq=3)],
        events=[event_row(f"e{s}", "r1", s) for s in (5, 0, 3, 1, 4, 2)]
        + [event_row("other", "r2", 0)],
    )
    _write(ch_client, ledger, batch)
    timeline = run_timeline(ch_client, ledger, "r1")
    assert timeline["run"]["status"] == "failed" and timeline["run"]["version"] == 3
    assert timeline["run"]["started_at"].tzinfo is not None
    assert [(t["turn"], t["kind"], t["attempt"]) for t in timeline["turns"]] == [
        (1, "deterministic", 0), (1, "model", 1), (2, "model", 1)]  # fmt: skip
    assert [u["event_id"] for u in timeline["usage"]] == ["u1", "u2"]
    assert [e["seq"] for e in timeline["events"]] == [0, 1, 2, 3, 4, 5]
    missing = run_timeline(ch_client, ledger, "nope")
    assert missing == {"run": None, "turns": [], "usage": [], "events": []}


def test_run_timeline_returns_the_views_rows(ch_client: Any, ledger: str) -> None:
    """run_timeline reads the storage tables: the rows it returns are the views' rows."""
    first = LedgerBatch(
        runs=[run_row("r1", status="running", version=1)],
        turns=[turn_row("r1", 1, seq=2), turn_row("r1", 2, seq=4)],
        usage=[usage_row("u1", "r1", seq=3), usage_row("u2", "r1", seq=5, turn=2)],
        events=[event_row(f"e{s}", "r1", s) for s in range(6)],
    )
    # a later terminal below seq 4: the second turn, its usage and events are retracted
    later = LedgerBatch(
        runs=[run_row("r1", status="failed", version=5)],
        turns=[dataclasses.replace(turn_row("r1", 2, seq=4), version=5, retracted=True)],
        usage=[usage_row("u2", "r1", seq=5, turn=2, version=5, retracted=True)],
        events=[
            dataclasses.replace(event_row(f"e{s}", "r1", s), version=5, retracted=True)
            for s in (4, 5)
        ],
    )
    _write(ch_client, ledger, first)
    _write(ch_client, ledger, later, first=10)
    timeline = run_timeline(ch_client, ledger, "r1")
    views = {
        "turns": "turns WHERE run_id = 'r1' ORDER BY turn, attempt, seq",
        "usage": "usage WHERE run_id = 'r1' ORDER BY seq",
        "events": "run_events WHERE run_id = 'r1' ORDER BY seq, event_id",
    }
    for key, view in views.items():
        expected = query(ch_client, f"SELECT * FROM {ledger}.{view}").dicts()
        assert timeline[key] == expected, key
    assert [e["seq"] for e in timeline["events"]] == [0, 1, 2, 3]
    assert [u["event_id"] for u in timeline["usage"]] == ["u1"]
    runs = query(ch_client, f"SELECT * FROM {ledger}.runs WHERE run_id = 'r1'").dicts()
    assert timeline["run"] == runs[0] and runs[0]["status"] == "failed"
