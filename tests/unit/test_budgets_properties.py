"""Budgets are a function of the set (schemas/CONTRACT.md rules 10 and 16, issue 31).

A fleet's usage rows, each with its history of versions (a re-stated owner, a retraction,
a superseded estimate, a currency), are split over lanes, sent in any order and batch
sizes, re-delivered after restarts from the stored state: the desk's firing and resolved
alerts and its settled spend are always the oracle's, computed from the latest version of
each row alone, with one alert row per scope x threshold x period. The state is restored
from one record or from the changelog of per-row records, alike.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from decimal import Decimal, localcontext

import orjson
from hypothesis import event, given, settings
from hypothesis import strategies as st

from prism.pipeline.budgets import BudgetDesk, Budgets, SpendRow, alert_id, period_bounds
from prism.pipeline.budgets._desk import _EXACT
from prism.pipeline.budgets._period import to_us
from prism.pipeline.core import LaneReport

T0 = datetime.fromisoformat("2026-11-29T18:00:00+00:00")
BUDGETS = Budgets.model_validate(
    {
        "budgets": [
            {
                "name": "acme",
                "scope": {"tenant": "acme"},
                "currency": "USD",
                "period": "day",
                "timezone": "America/New_York",
                "amount": "12",
                "thresholds": {"percent": [50, 100], "absolute": ["4"]},
            },
            {
                "name": "acme-bot",
                "scope": {"tenant": "acme", "agent": "bot"},
                "currency": "EUR",
                "period": "week",
                "timezone": "Europe/Berlin",
                "amount": "6",
            },
            {
                "name": "globex-m1",
                "scope": {"tenant": "globex", "model": "m1"},
                "currency": "USD",
                "period": "month",
                "timezone": "UTC",
                "amount": "5",
                "thresholds": {"percent": [80, 100]},
            },
        ],
        "rates": [
            {"from": "USD", "to": "EUR", "rate": "0.9", "valid_from": "2026-11-01"},
            {"from": "USD", "to": "EUR", "rate": "0.8", "valid_from": "2026-12-01"},
            {"from": "EUR", "to": "USD", "rate": "1.25", "valid_from": "2026-11-30"},
        ],
    }
)
Item = tuple[str, object]
COSTS = ["0.5", "1.75", "3", "4.5"]


@st.composite
def versions(draw: st.DrawFn, eid: str, ts_us: int) -> list[SpendRow]:
    """A usage row's versions, in the order its lane writes them."""
    out = []
    for v in range(1, draw(st.integers(1, 3)) + 1):
        kind = draw(st.sampled_from(["reported", "reported", "estimated", "none"]))
        priced = kind == "reported" and draw(st.integers(0, 4)) > 0
        out.append(
            SpendRow(
                event_id=eid,
                run_id=f"run-{eid[1:]}",
                turn=1,
                attempt=1,
                version=v * 4,
                ts_us=ts_us,
                kind=kind,
                tenant=draw(st.sampled_from(["acme", "acme", "globex", "globex", None])),
                agent=draw(st.sampled_from(["bot", "other"])),
                model=draw(st.sampled_from(["m1", "m2"])),
                cost=Decimal(draw(st.sampled_from(COSTS))) if priced else None,
                currency=draw(st.sampled_from(["USD", "USD", "EUR", "GBP"])) if priced else None,
                priced_by="runtime" if priced else "unpriced",
                input_tokens=draw(st.integers(0, 50)),
                output_tokens=draw(st.integers(0, 50)),
            )
        )
    return out


@st.composite
def fleets(draw: st.DrawFn) -> tuple[list[SpendRow], list[list[Item]]]:
    """The latest version of each row, and per lane the chunks a pipeline could send: each
    chunk's rows, then the lane's report (mark = the latest time it sent, held back by the
    earliest row it has yet to send, as a lane's backlog and waiting runs hold it)."""
    n = draw(st.integers(0, 24))
    lanes = draw(st.integers(1, 3))
    per_lane: list[list[list[SpendRow]]] = [[] for _ in range(lanes)]
    latest = []
    for i in range(n):  # around three days: periods of every budget roll over
        ts = to_us(T0 + timedelta(minutes=draw(st.integers(0, 3 * 24 * 60), label="minute")))
        history = draw(versions(f"e{i}", ts))
        latest.append(history[-1])
        per_lane[draw(st.integers(0, lanes - 1))].append(history)
    streams: list[list[Item]] = []
    for lane, histories in enumerate(per_lane):
        order: list[SpendRow] = []
        queues = [list(h) for h in histories]
        while any(queues):  # rows interleave; each row's versions stay in order
            q = draw(st.sampled_from([q for q in queues if q]))
            order.append(q.pop(0))
        items: list[Item] = []
        mark, i = 0, 0
        while i < len(order):
            size = draw(st.integers(1, 4))
            chunk, i = order[i : i + size], i + size
            mark = max([mark, *(r.ts_us for r in chunk)])
            rest = [r.ts_us for r in order[i:]]
            items += [("row", r) for r in chunk]
            items.append(("report", (lane, LaneReport(mark, min(rest) if rest else None))))
        streams.append(items)
    return latest, streams


def oracle(latest: list[SpendRow], until_us: int) -> tuple[set[tuple[str, int]], set[str], dict]:
    """Firings (alert id, time), resolved ids and settled spend per (budget, period start),
    from the latest version of each row alone."""
    fired: set[tuple[str, int]] = set()
    resolved: set[str] = set()
    spent: dict[tuple[str, int], Decimal] = {}
    with localcontext(_EXACT):
        for b in BUDGETS.budgets:
            by_period: dict[int, list[tuple[int, Decimal]]] = defaultdict(list)
            for r in latest:
                if r.kind != "reported" or r.cost is None or r.tenant is None:
                    continue
                if not b.scope.matches(r.owner()) or r.ts_us > until_us:
                    continue
                rate = Decimal(1) if r.currency == b.currency else None
                rate = rate or BUDGETS.rate(r.currency or "", b.currency, r.ts_us)
                if rate is not None:
                    by_period[period_bounds(b.period, b.tz, r.ts_us)[0]].append(
                        (r.ts_us, r.cost * rate)
                    )
            for start, entries in by_period.items():
                spent[(b.scope_id, start)] = sum((a for _, a in entries), Decimal(0))
                for label, amount in b.threshold_amounts():
                    total = Decimal(0)
                    for ts in sorted({t for t, _ in entries}):
                        total = sum((a for t, a in entries if t <= ts), Decimal(0))
                        if total >= amount:
                            fired.add((alert_id(b, label, start), ts))
                            end = period_bounds(b.period, b.tz, start)[1]
                            if end <= until_us:
                                resolved.add(alert_id(b, label, start))
                            break
    return fired, resolved, spent


@settings(max_examples=200, deadline=None)
@given(fleets(), st.data())
def test_alerts_and_settled_spend_are_a_function_of_the_set(
    case: tuple[list[SpendRow], list[list[Item]]], data: st.DataObject
) -> None:
    latest, streams = case
    lanes = len(streams)
    desk = BudgetDesk(BUDGETS, 0.0, range(lanes))
    queues = [list(s) for s in streams]
    sent: list[Item] = []
    while any(queues):  # lanes interleave on the one topic; each keeps its order
        q = data.draw(st.sampled_from([q for q in queues if q]))
        sent.append(q.pop(0))
    alerts = []
    changelog: dict[bytes, bytes] = {}  # the compacted changelog of the desk's state
    pos = 0
    while pos < len(sent):
        size = data.draw(st.integers(1, 6))
        batch, pos = sent[pos : pos + size], pos + size
        if data.draw(st.booleans()):  # a restart: the stored state, then re-delivery
            if data.draw(st.booleans()):
                desk = BudgetDesk.from_bytes(desk.to_bytes(), BUDGETS)
            elif changelog:
                desk = BudgetDesk.from_state(changelog, BUDGETS)
            else:  # nothing stored yet: a fresh desk
                desk = BudgetDesk(BUDGETS, 0.0, range(lanes))
            if data.draw(st.booleans()):
                batch = sent[max(0, pos - size - 3) : pos]
        if data.draw(st.booleans()):  # a re-sent older version of some row changes nothing
            rows = [item for kind, item in sent[:pos] if kind == "row"]
            if rows:
                batch = [*batch, ("row", data.draw(st.sampled_from(rows)))]
        for kind, item in batch:
            if kind == "row":
                assert isinstance(item, SpendRow)
                desk.observe([item])
            else:
                lane, report = item  # type: ignore[misc]
                desk.report(lane, report)
        alerts += desk.decide()
        desk.states()
        for key, value in desk.state_writes().items():  # committed with the batch
            if value is None:
                changelog.pop(key, None)
            else:
                changelog[key] = value
    for lane in range(lanes):  # every lane caught up and quiet: the stream ended
        mark = desk.lanes[lane].mark_us if lane in desk.lanes else 0
        desk.report(lane, LaneReport(mark, None, idle=True, quiet=True))
    alerts += desk.decide()
    fired, resolved, spent = oracle(latest, desk.watermark_us)
    firing = [(r.alert_id, to_us(r.ts)) for r in alerts if r.state == "firing"]
    assert sorted(firing) == sorted(fired)
    assert len({a for a, _ in firing}) == len(firing)  # one row per scope x threshold x period
    assert sorted(r.alert_id for r in alerts if r.state == "resolved") == sorted(resolved)
    assert desk.late == 0
    event(f"firings: {min(len(fired), 6)}, resolved: {min(len(resolved), 3)}")
    for rec in desk.states(changed_only=False):  # the settled period's spend, per budget
        value = orjson.loads(rec.value)
        b = next(b for b in BUDGETS.budgets if b.scope_id == rec.key.decode())
        start = period_bounds(b.period, b.tz, desk.decided_us)[0]
        assert Decimal(value["spent"]) == spent.get((b.scope_id, start), Decimal(0))
        assert value["spent"] == value["provisional"]  # the stream ended: all is settled


@settings(max_examples=150, deadline=None)
@given(fleets(), st.data())
def test_late_rows_never_reopen_or_repeat_an_alert_and_still_count_in_their_period(
    case: tuple[list[SpendRow], list[list[Item]]], data: st.DataObject
) -> None:
    """Reports that do not hold the watermark for rows still to come (a lane that ran
    ahead): rows arrive late, yet each alert fires at most once, resolves only after it
    fired, and the last period's settled spend is still the whole set's."""
    latest, streams = case
    lanes = len(streams)
    desk = BudgetDesk(BUDGETS, data.draw(st.sampled_from([0.0, 60.0, 3600.0])), range(lanes))
    sent = [item for s in streams for item in s]
    sent = data.draw(st.permutations(sent))  # lanes' items out of order: marks run ahead
    alerts = []
    for kind, item in sent:
        if kind == "row":
            assert isinstance(item, SpendRow)
            desk.observe([item])
        else:
            lane, report = item  # type: ignore[misc]
            desk.report(lane, LaneReport(report.mark_us, None))  # holds nothing back
        alerts += desk.decide()
        if data.draw(st.booleans()):
            desk = BudgetDesk.from_bytes(desk.to_bytes(), BUDGETS)
    # the stream ends: each lane reports past everything it sent, so the rows that came
    # late (counted from the first unsettled instant) are settled too
    end = max((r.ts_us for r in latest), default=0) + 1
    for lane in range(lanes):
        desk.report(lane, LaneReport(end, None, idle=True, quiet=True))
    alerts += desk.decide()
    firing = [r.alert_id for r in alerts if r.state == "firing"]
    resolved = [r.alert_id for r in alerts if r.state == "resolved"]
    assert len(set(firing)) == len(firing)
    assert len(set(resolved)) == len(resolved)
    assert set(resolved) <= set(firing)
    event(f"late: {min(desk.late, 5)}")
    _, _, spent = oracle(latest, desk.watermark_us)
    for rec in desk.states(changed_only=False):
        value = orjson.loads(rec.value)
        b = next(b for b in BUDGETS.budgets if b.scope_id == rec.key.decode())
        start = period_bounds(b.period, b.tz, desk.decided_us)[0]
        assert Decimal(value["spent"]) == spent.get((b.scope_id, start), Decimal(0))
