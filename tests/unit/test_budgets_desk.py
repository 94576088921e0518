"""The budget desk: settled spend, thresholds fired once per period at the crossing, late
rows, moves between scopes, currencies, state records, and its stored state."""

from __future__ import annotations

import gc
import tracemalloc
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import orjson
import pytest

from prism.pipeline.budgets import (
    BudgetDesk,
    Budgets,
    BudgetStateError,
    SpendRow,
    decode_budget_input,
    spend_records,
)
from prism.pipeline.budgets._period import to_us
from prism.pipeline.core import LaneReport, Output, decode_alerter_input, lane_record

T0 = datetime.fromisoformat("2026-11-20T00:00:00+00:00")
CONTRACT_FIELDS = {
    "scope", "currency", "period", "amount", "spent", "provisional", "estimatedAtRisk",
    "unconverted", "state", "thresholdsCrossed", "asOf",
}  # fmt: skip


def budgets(**extra: Any) -> Budgets:
    return Budgets.model_validate(
        {
            "budgets": [
                {
                    "name": "acme-daily",
                    "scope": {"tenant": "acme"},
                    "currency": "USD",
                    "period": "day",
                    "timezone": "UTC",
                    "amount": "10",
                    "thresholds": {"percent": [50, 100], "absolute": ["3"]},
                },
                {
                    "name": "acme-bot",
                    "scope": {"tenant": "acme", "agent": "bot"},
                    "currency": "EUR",
                    "period": "day",
                    "timezone": "UTC",
                    "amount": "4",
                },
            ],
            "rates": [{"from": "USD", "to": "EUR", "rate": "0.5", "valid_from": "2026-11-20"}],
            **extra,
        }
    )


def row(eid: str, minute: int, cost: str | None = "1", *, version: int = 1, **kw: Any) -> SpendRow:
    fields: dict[str, Any] = {
        "tenant": "acme",
        "agent": "bot",
        "model": "m1",
        "kind": "reported",
        "currency": "USD",
        "priced_by": "runtime",
    }
    fields.update(kw)
    return SpendRow(
        event_id=eid,
        run_id=f"run-{eid}",
        turn=1,
        attempt=1,
        version=version,
        ts_us=to_us(T0 + timedelta(minutes=minute)),
        cost=None if cost is None else Decimal(cost),
        **fields,
    )


def at(minute: int) -> int:
    return to_us(T0 + timedelta(minutes=minute))


def state(desk: BudgetDesk, scope_id: str = "tenant=acme") -> dict[str, Any]:
    for rec in desk.states(changed_only=False):
        if rec.key == scope_id.encode():
            return orjson.loads(rec.value)
    raise AssertionError(scope_id)


def test_thresholds_fire_at_the_crossing_once_settled_and_resolve_at_the_period_end() -> None:
    desk = BudgetDesk(budgets(), lateness_s=60, lanes=[0])
    desk.observe([row("a", 10, "2"), row("b", 20, "2"), row("c", 30, "2")])
    desk.report(0, LaneReport(at(21)))
    assert desk.decide() == []  # minute 20 is not settled before the watermark less a minute
    desk.report(0, LaneReport(at(21) + 2))
    fired = desk.decide()
    assert [(r.alert_id, r.ts) for r in fired] == [
        ("budget_threshold:tenant=acme:3:2026-11-20T00:00:00+00:00", T0 + timedelta(minutes=20))
    ]
    assert fired[0].value == 4.0 and fired[0].threshold == 3.0
    assert (
        "budget_used_ratio 0.4000" in fired[0].message and "top runs: run-a 2" in fired[0].message
    )
    desk.observe([row("d", 50, "4")])
    desk.report(0, LaneReport(at(24 * 60 + 5), idle=True))
    rows = desk.decide()
    assert [(r.state, r.key, r.ts.isoformat()) for r in rows] == [
        ("firing", "tenant=acme:50%", "2026-11-20T00:30:00+00:00"),
        ("firing", "tenant=acme:100%", "2026-11-20T00:50:00+00:00"),
        ("firing", "tenant=acme;agent=bot:100%", "2026-11-20T00:50:00+00:00"),  # 5 EUR
        ("resolved", "tenant=acme:100%", "2026-11-21T00:00:00+00:00"),
        ("resolved", "tenant=acme:3", "2026-11-21T00:00:00+00:00"),
        ("resolved", "tenant=acme:50%", "2026-11-21T00:00:00+00:00"),
        ("resolved", "tenant=acme;agent=bot:100%", "2026-11-21T00:00:00+00:00"),
    ]
    assert {r.alert_id for r in rows if r.state == "resolved"} <= {
        r.alert_id for r in [*fired, *rows] if r.state == "firing"
    }


def test_the_budget_state_record_is_the_contracts() -> None:
    desk = BudgetDesk(budgets(), lanes=[0])
    desk.observe(
        [
            row("a", 1, "4"),
            row("b", 2, "2.5", currency="GBP"),  # no GBP rate: unconverted, never summed
            row("e", 3, None, kind="estimated", currency=None, input_tokens=100, output_tokens=7),
            row("f", 90, "1"),  # beyond the settled time: provisional only
        ]
    )
    desk.report(0, LaneReport(at(60)))
    desk.decide()
    value = state(desk)
    assert set(value) == CONTRACT_FIELDS
    assert value | {"asOf": None} == {
        "scope": {"tenant": "acme"},
        "currency": "USD",
        "period": {"start": "2026-11-20T00:00:00+00:00", "end": "2026-11-21T00:00:00+00:00"},
        "amount": "10",
        "spent": "4",
        "provisional": "5",
        "estimatedAtRisk": {"rows": 1, "inputTokens": 100, "outputTokens": 7},
        "unconverted": {"GBP": "2.5"},
        "state": "warning",
        "thresholdsCrossed": ["3"],
        "asOf": None,
    }
    assert value["asOf"] == "2026-11-20T00:59:59.999999+00:00"
    bot = state(desk, "tenant=acme;agent=bot")
    assert (bot["currency"], bot["spent"], bot["provisional"]) == ("EUR", "2", "2.5")
    assert desk.states() == []  # nothing changed since: nothing produced again


def test_a_row_later_than_the_allowed_lateness_counts_late_and_reopens_nothing() -> None:
    desk = BudgetDesk(budgets(), lanes=[0])
    desk.observe([row("a", 10, "2.5")])
    desk.report(0, LaneReport(at(60)))
    assert desk.decide() == []
    desk.observe([row("late", 5, "1")])  # settled time already past minute 5
    assert desk.late == 1
    desk.report(0, LaneReport(at(61)))
    fired = desk.decide()
    # it counts in its own period from the first unsettled instant, not at minute 5
    assert [(r.key, r.ts) for r in fired] == [("tenant=acme:3", T0 + timedelta(minutes=60))]
    assert state(desk)["spent"] == "3.5"


def test_retraction_and_restated_owner_move_spend_between_scopes() -> None:
    desk = BudgetDesk(budgets(), lanes=[0])
    desk.observe([row("a", 1, "3", agent="other"), row("b", 2, "3")])
    desk.observe([row("a", 1, "3", version=2), row("b", 2, "3", version=2, kind="none")])
    desk.observe([row("a", 1, "3", agent="other"), row("b", 2, "3")])  # stale re-deliveries
    desk.report(0, LaneReport(at(10)))
    desk.decide()
    assert (state(desk)["spent"], state(desk, "tenant=acme;agent=bot")["spent"]) == ("3", "1.5")
    desk.observe([row("a", 1, "3", version=3, tenant="globex")])  # late, and leaves acme
    assert (state(desk)["spent"], desk.late) == ("0", 1)


def test_state_round_trips_and_another_format_is_refused() -> None:
    desk = BudgetDesk(budgets(), lateness_s=5, lanes=[0, 1])
    desk.observe([row("a", 1, "4"), row("b", 30, "4")])
    desk.report(0, LaneReport(at(10)))
    desk.report(1, LaneReport(at(40), idle=True))
    desk.decide()
    again = BudgetDesk.from_bytes(desk.to_bytes(), budgets())
    assert again.to_bytes() == desk.to_bytes()
    assert [r.value for r in again.states(changed_only=False)] == [
        r.value for r in desk.states(changed_only=False)
    ]
    changelog = {k: v for k, v in desk.state_writes().items() if v is not None}
    assert len(changelog) == 3  # the header and one record per row
    assert BudgetDesk.from_state(changelog, budgets()).to_bytes() == desk.to_bytes()
    desk.observe([row("a", 1, "5", version=2)])
    assert list(desk.state_writes()) == [b"budget-desk:row:a", b"budget-desk"]  # what changed
    with pytest.raises(BudgetStateError, match="no header record 'budget-desk'"):
        BudgetDesk.from_state({}, budgets())
    raw = orjson.loads(desk.to_bytes())
    with pytest.raises(BudgetStateError, match="format 0 cannot be read"):
        BudgetDesk.from_bytes(orjson.dumps(raw | {"v": 0}), budgets())


def test_spend_records_round_trip_and_the_exhaustion_alerter_skips_them() -> None:
    from prism.schemas import LedgerBatch, RunRow, UsageRow

    def usage(eid: str, **kw: Any) -> UsageRow:
        base: dict[str, Any] = dict(
            event_id=eid, run_id="r1", seq=1, tenant_id="acme", account_id=None,
            provider="p", model="m1", scope="provider_turn", turn=1, attempt=1,
            entry_id=None, input_tokens=10, output_tokens=5, total_tokens=None,
            cache_read_tokens=None, cache_write_tokens=None, cost=Decimal("0.25"),
            currency="USD", estimated=False, confidence=None, recorded_at=T0,
        )  # fmt: skip
        return UsageRow(**(base | kw))

    run = RunRow.__new__(RunRow)
    run.run_id, run.user_id, run.agent_id = "r1", "u1", "bot"
    out = Output(
        ledger=LedgerBatch(
            runs=[run],
            usage=[
                usage("e1"),
                usage("e2", turn=2, cost=None, currency=None, estimated=True, confidence="low"),
                usage("e3", turn=3, retracted=True),
                usage("e4", scope="run_total", turn=None, attempt=None),
            ],
        )
    )
    records = spend_records(out)
    values = [r.value for r in records] + [lane_record(0, LaneReport(5)).value]
    desk = BudgetDesk(budgets(), lanes=[0])
    desk.step(values)
    got = {eid: (r.kind, r.user, r.agent, r.cost) for eid, (r, _) in desk.rows.items()}
    assert got == {
        "e1": ("reported", "u1", "bot", Decimal("0.25")),
        "e2": ("estimated", "u1", "bot", None),
        "e3": ("none", "u1", "bot", None),
    }
    assert desk.lanes == {0: LaneReport(5)}
    assert decode_alerter_input(values) == ([], {0: LaneReport(5)})


def test_the_price_book_prices_a_reported_row_without_cost_as_billing_does() -> None:
    from prism.pipeline.budgets import PriceBook
    from prism.schemas import UsageRow
    from prism.sinks import PriceRow

    def price(kind: str, unit: str, since: str, currency: str = "USD") -> PriceRow:
        return PriceRow("p", "m1", kind, currency, datetime.fromisoformat(since), Decimal(unit))

    book = PriceBook(
        [
            price("input", "3", "2026-11-01T00:00:00+00:00"),
            price("input", "2", "2026-11-20T00:00:30+00:00"),  # after the row: not used
            price("output", "15", "2026-11-01T00:00:00+00:00"),
            price("cache_read", "0.3", "2026-11-01T00:00:00+00:00"),
            price("cache_write", "3.75", "2026-11-01T00:00:00+00:00"),
        ]
    )
    usage = UsageRow(
        event_id="e", run_id="r", seq=1, tenant_id="acme", account_id=None, provider="p",
        model="m1", scope="provider_turn", turn=1, attempt=1, entry_id=None,
        input_tokens=1000, output_tokens=50, total_tokens=None, cache_read_tokens=200,
        cache_write_tokens=100, cost=None, currency=None, estimated=False, confidence=None,
        recorded_at=T0,
    )  # fmt: skip
    # 700 uncached input at 3, 50 output at 15, 200 read at 0.3, 100 written at 3.75 per 1M
    assert book.price(usage) == (Decimal("0.002100") + Decimal("0.000750") + Decimal("0.00006")
                                 + Decimal("0.000375"), "USD")  # fmt: skip
    usage.model = "m2"
    assert book.price(usage) is None  # the book does not price it: unpriced
    usage.model, usage.cache_write_tokens = "m1", None
    usage.currency = "EUR"
    assert book.price(usage) is None  # no EUR prices for m1


def test_a_lanes_hold_on_copies_sent_elsewhere_reaches_the_desk_and_its_state() -> None:
    held = LaneReport(at(40), None, idle=True, quiet=True, hold_us=at(12))
    rows, reports = decode_budget_input([lane_record(1, held, 5.0).value])
    assert rows == [] and reports == {1: held}
    desk = BudgetDesk(budgets(), lateness_s=0, lanes=[0, 1])
    desk.report(0, LaneReport(at(40), idle=True, quiet=True))
    desk.report(1, held)
    assert BudgetDesk.from_bytes(desk.to_bytes(), budgets()).lanes[1].hold_us == at(12)


def test_the_last_state_sent_per_budget_is_held_at_its_size() -> None:
    """The desk keeps each budget's last state for as long as it runs; orjson's result keeps
    the buffer it grew (8 KiB for a few hundred bytes), so what is kept is a copy of its
    size: freeing them gives back about their length, not their buffers."""
    scopes = [{"tenant": f"t{i}"} for i in range(100)]
    many = budgets(
        budgets=[
            {"name": f"b{i}", "scope": scope, "currency": "USD", "period": "day",
             "timezone": "UTC", "amount": "10"}
            for i, scope in enumerate(scopes)
        ]
    )  # fmt: skip
    desk = BudgetDesk(many, lateness_s=60, lanes=[0])
    desk.report(0, LaneReport(at(10)))
    desk.decide()  # settles up to the watermark: each budget has a state to send
    tracemalloc.start()  # before the states are made: it counts only what it saw made
    try:
        assert len(desk.states()) == 100
        size = sum(map(len, desk._sent.values()))
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        for scope_id in desk._sent:  # each state's one reference; the dict stays as it is
            desk._sent[scope_id] = b""
        gc.collect()
        freed = before - tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert size / 2 < freed < size + 100 * 64  # each state and its object header, no more
