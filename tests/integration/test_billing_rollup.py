"""The billing rollup gives the lines the rows give (FINAL), whatever was stored (chDB).

The reference is ``billing_report(..., rollup=False)``: every row read with ``FINAL``. The
rollup must equal it on hostile fleets (retractions, re-stated owners, superseded
estimates, every row version the core wrote), after a batch is stored twice, after a
re-stepped batch writes new versions, after two ledgers are folded, and across merges,
mutations and dropped parts.
"""

from __future__ import annotations

import uuid
import zlib
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prism.pipeline.core import Output
from prism.schemas import LedgerBatch
from prism.sinks import (
    LedgerWriter,
    SourceRange,
    billing_report,
    migrate,
    refresh_billing_rollup,
)
from prism.sinks._rollup import plan_rollup
from tests.fixtures.final_ledger import FinalLedger, feed_stream
from tests.fixtures.hostile import Fleet, fleets
from tests.fixtures.runs import NOW
from tests.unit.test_core_properties import CFG, SOURCE

pytestmark = pytest.mark.integration

NOV = datetime(2026, 11, 1, tzinfo=UTC)
DEC = datetime(2026, 12, 1, tzinfo=UTC)
GROUPINGS = [
    ("tenant", "provider", "model"),
    ("tenant", "day"),
    ("month", "account"),
    ("model",),
]
PERIODS = [
    (NOV, DEC),
    (datetime(2026, 11, 30, 11, 30, tzinfo=UTC), DEC),
    (datetime(2026, 10, 2, 7, tzinfo=UTC), datetime(2026, 11, 30, tzinfo=UTC)),
    (datetime(2026, 1, 1, tzinfo=UTC), datetime(2200, 1, 1, tzinfo=UTC)),
    (datetime(2026, 1, 1, tzinfo=UTC), datetime(2149, 6, 1, tzinfo=UTC)),
    (datetime(2199, 6, 1, tzinfo=UTC), datetime(2199, 6, 2, tzinfo=UTC)),  # skewed clocks
]


class _Recording(FinalLedger):
    """A FinalLedger that also keeps every batch, as the worker would have stored them."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[LedgerBatch] = []

    def add(self, out: Output | LedgerBatch) -> None:
        super().add(out)
        self.batches.append(out.ledger if isinstance(out, Output) else out)


def _partition(value: bytes, partitions: int) -> int:
    try:
        run_id = orjson.loads(value).get("runId")
    except (orjson.JSONDecodeError, AttributeError):
        run_id = None
    return zlib.crc32(str(run_id).encode()) % partitions


@pytest.fixture
def fresh_ledger(ch_client: Any) -> Iterator[Any]:
    """A factory of migrated, randomly named databases, all dropped afterwards."""
    made: list[str] = []

    def make() -> str:
        name = f"t_{uuid.uuid4().hex[:12]}"
        ch_client.command(f"CREATE DATABASE {name}")
        made.append(name)
        migrate(ch_client, name)
        return name

    yield make
    for name in made:
        ch_client.command(f"DROP DATABASE IF EXISTS {name} SYNC")


def _store(client: Any, db: str, batches: list[LedgerBatch], source: str = SOURCE) -> None:
    """Each batch in its own flush, with its own offsets: one insert per table per batch."""
    writer = LedgerWriter(client, db)
    for i, batch in enumerate(batches):
        if len(batch):
            writer.add(batch, SourceRange(source, 0, i, i))
            writer.flush()


# Every grouping over every period, for all tenants and for one: 48 reports a side. A fleet
# reads a drawn handful of them (each at every step), so 20 fleets cover them between them.
CASES = [(dims, period) for dims in GROUPINGS for period in PERIODS]


def _report(client: Any, db: str, cases: list[Any], *, rollup: bool) -> list[Any]:
    return [
        billing_report(client, db, lo, hi, group_by=dims, rollup=rollup)
        + billing_report(client, db, lo, hi, "acme", group_by=dims, rollup=rollup)
        for dims, (lo, hi) in cases
    ]


def _uses_rollup(client: Any, db: str, lo: datetime = NOV, hi: datetime = DEC) -> bool:
    plan = plan_rollup(client, db, lo, hi, price_book=False, refresh_sql="", refresh_before=None)
    return plan is not None and bool(plan.refresh_ids)


def _billed(client: Any, db: str) -> dict[tuple[Any, ...], tuple[int, Any, Any]]:
    lines = billing_report(client, db, NOV, DEC, group_by=("tenant",))
    return {
        (line.tenant_id, line.kind, line.currency): (line.rows, line.input_tokens, line.cost)
        for line in lines
    }


@settings(
    max_examples=20,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)
@given(fleet=fleets(), data=st.data())
def test_the_rollup_equals_the_rows_on_hostile_fleets(
    ch_client: Any, fresh_ledger: Any, fleet: Fleet, data: st.DataObject
) -> None:
    values = list(data.draw(st.permutations(fleet)))
    for _ in range(data.draw(st.integers(0, 3))):  # re-delivered records
        values.insert(data.draw(st.integers(0, len(values))), data.draw(st.sampled_from(fleet)))
    recorded = _Recording()
    feed_stream(
        values,
        config=CFG,
        source=SOURCE,
        partition_of=_partition,
        now=NOW,
        partitions=data.draw(st.integers(1, 3)),
        batch_sizes=data.draw(st.lists(st.integers(1, 8), min_size=1, max_size=3)),
        invocations=data.draw(st.lists(st.integers(0, len(values)), max_size=2)),
        ledger=recorded,
    )
    db = fresh_ledger()
    cases = data.draw(st.lists(st.sampled_from(CASES), min_size=4, max_size=4, unique=True))
    batches = recorded.batches
    half = data.draw(st.integers(0, len(batches)))
    _store(ch_client, db, batches[:half])
    refresh_billing_rollup(ch_client, db)
    # the rest arrives after the refresh: the months it touches are read from rows again
    _store(ch_client, db, batches[half:], source="later")
    assert _report(ch_client, db, cases, rollup=True) == _report(ch_client, db, cases, rollup=False)
    refresh_billing_rollup(ch_client, db)
    # batches stored again, under new offsets and from another ledger folded in
    again = data.draw(st.lists(st.integers(0, max(0, len(batches) - 1)), max_size=4))
    _store(ch_client, db, [batches[i] for i in again if batches])
    _store(ch_client, db, [batches[i] for i in again if batches], source="folded")
    assert _report(ch_client, db, cases, rollup=True) == _report(ch_client, db, cases, rollup=False)
    refresh_billing_rollup(ch_client, db)
    if any(u.recorded_at.year == 2026 for u in recorded.rows("usage")):
        assert _uses_rollup(ch_client, db)
    assert _report(ch_client, db, cases, rollup=True) == _report(ch_client, db, cases, rollup=False)
    # and both are the bill the final rows say (reported usage per tenant and currency)
    billed: dict[tuple[Any, Any], tuple[int, Decimal | None]] = {}
    for line in billing_report(ch_client, db, NOV, DEC, group_by=("tenant",)):
        if line.kind == "reported":
            tokens, cost = billed.get((line.tenant_id, line.currency), (0, None))
            if line.cost is not None:
                cost = (cost or Decimal(0)) + line.cost
            billed[(line.tenant_id, line.currency)] = (tokens + (line.input_tokens or 0), cost)
    assert billed == _november_bill(recorded)


def _november_bill(ledger: FinalLedger) -> dict[tuple[Any, Any], tuple[int, Decimal | None]]:
    """Reported provider_turn usage of November per (tenant, currency), from the final rows."""
    bill: dict[tuple[Any, Any], tuple[int, Decimal | None]] = {}
    for u in ledger.rows("usage"):
        if u.scope != "provider_turn" or u.estimated or u.superseded:
            continue
        if not NOV <= u.recorded_at < DEC:
            continue
        tokens, cost = bill.get((u.tenant_id, u.currency), (0, None))
        if u.cost is not None:
            cost = (cost or Decimal(0)) + u.cost
        bill[(u.tenant_id, u.currency)] = (tokens + (u.input_tokens or 0), cost)
    return bill


def _u(event_id: str, **kw: Any) -> Any:
    from prism.sinks.testing import usage_row

    kw.setdefault("recorded_at", datetime(2026, 11, 10, 12, tzinfo=UTC))
    return usage_row(event_id, kw.pop("run_id", "r1"), **kw)


def _batch(*usage: Any) -> LedgerBatch:
    batch = LedgerBatch()
    batch.usage.extend(usage)
    return batch


ROWS = [
    _u("u1", turn=1, input_tokens=100, cost=Decimal("0.10")),
    _u("u2", turn=2, input_tokens=200, cost=Decimal("0.20")),
    _u("u3", turn=3, input_tokens=300, cost=Decimal("3"), currency="EUR"),
    _u("u4", run_id="r2", tenant_id="globex", input_tokens=50, cost=Decimal("0.05")),
    _u("e1", turn=4, input_tokens=90, estimated=True, confidence="low", cost=None, currency=None),
]
EXPECTED = {
    ("acme", "reported", "USD"): (2, 300, Decimal("0.3")),
    ("acme", "reported", "EUR"): (1, 300, Decimal("3")),  # never summed with USD
    ("acme", "estimated", None): (1, 90, None),
    ("globex", "reported", "USD"): (1, 50, Decimal("0.05")),
}


def _write(client: Any, db: str, batch: LedgerBatch, source: str, offset: int) -> None:
    writer = LedgerWriter(client, db)
    writer.add(batch, SourceRange(source, 0, offset, offset))
    writer.flush()


def test_a_batch_stored_twice_counts_once(ch_client: Any, fresh_ledger: Any) -> None:
    db = fresh_ledger()
    _write(ch_client, db, _batch(*ROWS), SOURCE, 0)
    assert refresh_billing_rollup(ch_client, db) == ["202611"]
    assert _billed(ch_client, db) == EXPECTED
    _write(ch_client, db, _batch(*ROWS), SOURCE, 0)  # re-delivered: same token, dropped
    assert _uses_rollup(ch_client, db)
    assert _billed(ch_client, db) == EXPECTED
    _write(ch_client, db, _batch(*ROWS), SOURCE, 7)  # the same rows from other offsets
    assert not _uses_rollup(ch_client, db)  # a new part: the month is read from rows
    assert _billed(ch_client, db) == EXPECTED  # a past month: billing refreshed it
    assert _uses_rollup(ch_client, db)
    assert refresh_billing_rollup(ch_client, db) == []
    assert _billed(ch_client, db) == EXPECTED


def test_a_restepped_batch_with_new_versions_counts_its_last_versions(
    ch_client: Any, fresh_ledger: Any
) -> None:
    db = fresh_ledger()
    _write(ch_client, db, _batch(*ROWS), SOURCE, 0)
    refresh_billing_rollup(ch_client, db)
    # the batch again after a crash, split otherwise: u2 found post-terminal (retracted),
    # u4's run re-stated to acme, every row at a higher version
    again = [replace(r, version=9) for r in ROWS]
    again[1] = replace(again[1], retracted=True)
    again[3] = replace(again[3], tenant_id="acme")
    _write(ch_client, db, _batch(*again[:2]), SOURCE, 0)
    _write(ch_client, db, _batch(*again[2:]), SOURCE, 1)
    expected = {
        ("acme", "reported", "USD"): (2, 150, Decimal("0.15")),
        ("acme", "reported", "EUR"): (1, 300, Decimal("3")),
        ("acme", "estimated", None): (1, 90, None),
    }
    assert _billed(ch_client, db) == expected
    assert billing_report(ch_client, db, NOV, DEC, rollup=False) == billing_report(
        ch_client, db, NOV, DEC
    )
    refresh_billing_rollup(ch_client, db)
    assert _uses_rollup(ch_client, db)
    assert _billed(ch_client, db) == expected
    # the first attempt's batch re-delivered late, at its lower versions: changes nothing
    _write(ch_client, db, _batch(*ROWS), "replay", 0)
    assert _billed(ch_client, db) == expected


def test_two_folded_ledgers_count_once(ch_client: Any, fresh_ledger: Any) -> None:
    db = fresh_ledger()
    _write(ch_client, db, _batch(*ROWS), SOURCE, 0)
    refresh_billing_rollup(ch_client, db)
    _write(ch_client, db, _batch(*ROWS), "file:/backfill.jsonl", 0)  # the same events again
    assert _billed(ch_client, db) == EXPECTED
    refresh_billing_rollup(ch_client, db)
    assert _uses_rollup(ch_client, db)
    assert _billed(ch_client, db) == EXPECTED


def test_merges_keep_the_rollup_and_mutations_or_dropped_parts_do_not(
    ch_client: Any, fresh_ledger: Any
) -> None:
    db = fresh_ledger()
    _write(ch_client, db, _batch(*ROWS[:2]), SOURCE, 0)
    _write(ch_client, db, _batch(*ROWS[2:]), SOURCE, 1)
    refresh_billing_rollup(ch_client, db)
    ch_client.command(f"OPTIMIZE TABLE {db}.usage_store FINAL")
    assert _uses_rollup(ch_client, db)  # a merge changes no FINAL result
    assert _billed(ch_client, db) == EXPECTED
    ch_client.command(
        f"ALTER TABLE {db}.usage_store UPDATE input_tokens = 1 WHERE event_id = 'u1' "
        "SETTINGS mutations_sync = 2"
    )
    assert not _uses_rollup(ch_client, db)
    assert _billed(ch_client, db)[("acme", "reported", "USD")] == (2, 201, Decimal("0.3"))
    refresh_billing_rollup(ch_client, db)
    assert _uses_rollup(ch_client, db)
    _write(ch_client, db, _batch(_u("u9", input_tokens=7)), SOURCE, 2)
    refresh_billing_rollup(ch_client, db)
    parts = ch_client.query(
        "SELECT name FROM system.parts WHERE database = {db:String} AND table = 'usage_store' "
        "AND active ORDER BY max_block_number",
        parameters={"db": db},
    ).result_rows
    # u9's part gone: the data is again what the refresh after the mutation read
    ch_client.command(f"ALTER TABLE {db}.usage_store DETACH PART '{parts[-1][0]}'")
    assert _uses_rollup(ch_client, db)
    assert _billed(ch_client, db)[("acme", "reported", "USD")] == (2, 201, Decimal("0.3"))
    ch_client.command(f"ALTER TABLE {db}.usage_store ATTACH PART '{parts[-1][0]}'")
    assert not _uses_rollup(ch_client, db)  # attached under a new block number
    assert _billed(ch_client, db)[("acme", "reported", "USD")] == (3, 208, Decimal("0.3012"))
    refresh_billing_rollup(ch_client, db)
    ch_client.command(f"ALTER TABLE {db}.usage_store DETACH PART '{parts[0][0]}'")
    assert not _uses_rollup(ch_client, db)  # no refresh read only what is left
    assert _billed(ch_client, db) == {("acme", "reported", "USD"): (1, 7, Decimal("0.0012"))}
    assert billing_report(ch_client, db, NOV, DEC) == billing_report(
        ch_client, db, NOV, DEC, rollup=False
    )


def test_a_month_is_refreshed_only_once_it_is_over(ch_client: Any, fresh_ledger: Any) -> None:
    db = fresh_ledger()
    _write(ch_client, db, _batch(*ROWS), SOURCE, 0)
    today = datetime.now(UTC)
    plan = plan_rollup(
        ch_client,
        db,
        NOV,
        DEC,
        price_book=False,
        refresh_sql="SELECT 1",
        refresh_before=(NOV + timedelta(days=3)).date(),
    )
    assert plan is not None and plan.refresh_ids == ()
    assert billing_report(ch_client, db, NOV, DEC) == billing_report(
        ch_client, db, NOV, DEC, rollup=False
    )
    assert _uses_rollup(ch_client, db) == (DEC.date() <= today.date())


def test_times_past_the_date_range_read_rows(ch_client: Any, fresh_ledger: Any) -> None:
    """toDate() wraps after 2149-06-06: months from June 2149 on are never rolled up."""
    db = fresh_ledger()
    when = [datetime(2149, 5, 31, tzinfo=UTC), datetime(2149, 6, 5, tzinfo=UTC)]
    when += [datetime(2199, 6, 1, tzinfo=UTC), datetime(2199, 6, 2, tzinfo=UTC)]
    rows = [_u(f"f{i}", turn=i, recorded_at=t) for i, t in enumerate(when, 1)]
    _write(ch_client, db, _batch(*rows), SOURCE, 0)
    assert refresh_billing_rollup(ch_client, db) == ["214905"]
    for lo, hi in [
        (datetime(2149, 5, 1, tzinfo=UTC), datetime(2149, 6, 1, tzinfo=UTC)),
        (datetime(2149, 5, 1, tzinfo=UTC), datetime(2149, 7, 1, tzinfo=UTC)),
        (datetime(2199, 6, 1, tzinfo=UTC), datetime(2199, 6, 2, tzinfo=UTC)),
        (datetime(2026, 1, 1, tzinfo=UTC), datetime(2200, 1, 1, tzinfo=UTC)),
    ]:
        for dims in (("tenant",), ("day",)):
            assert billing_report(ch_client, db, lo, hi, group_by=dims) == billing_report(
                ch_client, db, lo, hi, group_by=dims, rollup=False
            ), (lo, hi, dims)
    assert _uses_rollup(
        ch_client, db, datetime(2149, 5, 1, tzinfo=UTC), datetime(2149, 6, 1, tzinfo=UTC)
    )


def test_a_refresh_that_cannot_see_every_row_stores_nothing(
    ch_client: Any, fresh_ledger: Any
) -> None:
    """An account whose row policy or table filter hides rows must not roll a month up."""
    db = fresh_ledger()
    _write(ch_client, db, _batch(*ROWS), SOURCE, 0)
    hide = f"{{'{db}.usage_store': 'tenant_id = ''acme'''}}"
    ch_client.set_client_setting("additional_table_filters", hide)
    try:
        assert refresh_billing_rollup(ch_client, db) == []
    finally:
        ch_client.set_client_setting("additional_table_filters", "{}")
    assert not _uses_rollup(ch_client, db)
    assert _billed(ch_client, db) == EXPECTED
