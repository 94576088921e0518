"""The worker's budget wiring: each lane's spend before its report in its slot's transaction,
the desk beside the exhaustion alerter, its records and state in the alerter's transaction,
and its next holder deciding nothing twice."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import TopicPartition

from prism.pipeline.budgets import spend_records
from prism.pipeline.budgets._period import to_us
from prism.pipeline.core import InRecord, Intake, LaneReport, Output, lane_record
from prism.pipeline.settings import Settings, SettingsError, load_settings
from prism.pipeline.worker._alerter import AlertDesk
from prism.pipeline.worker._budget_desk import LaneSpend
from prism.pipeline.worker._produce import ProducedRecord
from prism.pipeline.worker._slots import Slot, Slots
from tests.fixtures.events import event_bytes, make_event

T0 = datetime(2026, 11, 20, 9, 0, tzinfo=UTC)
BUDGETS = """
[[budgets]]
name = "acme-monthly"
scope = { tenant = "acme" }
currency = "USD"
period = "month"
timezone = "UTC"
amount = "10"
thresholds = { percent = [50, 100], absolute = ["3"] }
"""


def budgets_file(tmp_path: Path) -> Path:
    path = tmp_path / "budgets.toml"
    path.write_text(BUDGETS)
    return path


def stepped(runs: dict[str, str], *, cost_minutes: int = 1) -> Output:
    """The core's output for runs of tenant acme, each with one turn's usage of ``cost``
    USD at ``T0 + i`` minutes (no runtime cost: ``cost`` None)."""
    intake = Intake(Settings(grace_period_seconds=0.0).core_config(processing_grace=False))
    records = []
    for i, (run, cost) in enumerate(runs.items()):
        ts = (T0 + timedelta(minutes=i * cost_minutes)).isoformat()
        usage = {"inputTokens": 1000, "outputTokens": 100, "cost": cost, "currency": "USD"}
        if cost == "":
            usage = {"inputTokens": 1000, "outputTokens": 100}
        env = {"tenantId": "acme", "ts": ts}
        for seq, ev in enumerate(
            [
                make_event("agent_started", run, 0, envelope=env),
                make_event("usage_recorded", run, 1, envelope=env, usage=usage),
                make_event("agent_finished", run, 2, envelope=env),
            ]
        ):
            records.append(InRecord(event_bytes(ev), "in", 0, len(records), run.encode()))
            assert seq == ev["seq"]
    out = intake.step(0, records, T0.timestamp() + 86_400)
    intake.commit(0)
    return out


def report(minutes: float) -> bytes:
    mark = to_us(T0 + timedelta(minutes=minutes))
    value = lane_record(0, LaneReport(mark, None, idle=True, quiet=True), 1.0).value
    assert value is not None
    return value


def desk(tmp_path: Path, changelog: dict[bytes, bytes]) -> AlertDesk:
    settings = Settings(state_dir=tmp_path, partitions=1, grace_period_seconds=0.0,
                        budgets_file=budgets_file(tmp_path))  # fmt: skip
    d = AlertDesk(settings, settings.core_config())

    async def read(partition: int) -> dict[bytes, bytes]:
        return {}

    async def read_budgets(partition: int) -> dict[bytes, bytes]:
        return dict(changelog)

    d.reader.read = read  # type: ignore[method-assign]
    assert d.budgets is not None
    d.budgets.reader.read = read_budgets  # type: ignore[method-assign]
    return d


def apply(changelog: dict[bytes, bytes], records: list[ProducedRecord], topic: str) -> None:
    """What a compacted changelog keeps of a committed transaction's records."""
    for r in records:
        if r.topic == topic and r.key is not None:
            if r.value is None:
                changelog.pop(r.key, None)
            else:
                changelog[r.key] = r.value


def test_the_desk_decides_beside_the_alerter_and_its_next_holder_decides_nothing_twice(
    tmp_path: Path,
) -> None:
    changelog: dict[bytes, bytes] = {}
    spend = [r.value for r in spend_records(stepped({f"r{i}": "1" for i in range(6)}))]
    values: list[bytes | None] = [*spend, report(10)]

    async def go() -> None:
        d = desk(tmp_path, changelog)
        assert d.budgets is not None
        out = await d.step(values, 0, len(values) - 1)
        got = [(r.alert_id, r.state, r.value) for r in out.ledger.alerts]
        assert got == [
            ("budget_threshold:tenant=acme:3:2026-11-01T00:00:00+00:00", "firing", 3.0),
            ("budget_threshold:tenant=acme:50%:2026-11-01T00:00:00+00:00", "firing", 5.0),
        ]
        assert [orjson.loads(r.value or b"")["alertId"] for r in out.alerts] == [g[0] for g in got]
        assert out.ranges == [(d.topic, 0, 0, len(values) - 1)]
        assert out.stats["budgets.alerts"] == 2
        commit = d.commit_of(out, len(values))
        assert commit.offsets == {TopicPartition(d.topic, 0): len(values)}
        by_topic: dict[str, list[ProducedRecord]] = {}
        for r in commit.records:
            by_topic.setdefault(r.topic, []).append(r)
        (state,) = by_topic["prism.budget-state"]
        value = orjson.loads(state.value or b"")
        assert (state.key, value["spent"], value["state"]) == (b"tenant=acme", "6", "warning")
        assert value["thresholdsCrossed"] == ["3", "50%"]
        assert len(by_topic["prism.alerts"]) == 2
        keys = [r.key for r in by_topic[d.budgets.changelog]]
        assert b"budget-desk" in keys and len(keys) == 7  # the header and one per usage row
        apply(changelog, commit.records, d.budgets.changelog)  # the transaction committed
        assert d.budgets.records()[-1].key == b"budget-desk"  # no row changed since: header only
        d.forget()  # fenced or reassigned
        assert d.budgets.desk is None

        # the next holder reads the state back and the same values again: nothing twice,
        # and the state record again (every budget's, at the start)
        again = desk(tmp_path, changelog)
        out = await again.step(values, 0, len(values) - 1)
        assert out.ledger.alerts == []
        assert again.budgets is not None
        (state,) = [r for r in again.commit_of(out, 9).records if r.topic == again.budgets.topic]
        assert orjson.loads(state.value or b"")["spent"] == "6"
        # four more dollars cross 100% once
        more = [
            r.value
            for r in spend_records(stepped({f"s{i}": "1" for i in range(4)}, cost_minutes=0))
        ]
        out = await again.step([*more, report(20)], 9, 13)
        assert [(r.alert_id, r.value) for r in out.ledger.alerts] == [
            ("budget_threshold:tenant=acme:100%:2026-11-01T00:00:00+00:00", 10.0)
        ]
        # without the state the same values fire again: the state is what prevents it
        fresh = desk(tmp_path, {})
        assert len((await fresh.step(values, 0, len(values) - 1)).ledger.alerts) == 2

    asyncio.run(go())


def test_a_lanes_spend_goes_to_limit_deaths_before_its_report_in_its_slots_transaction() -> None:
    settings = Settings(partitions=2)
    t = settings.topics
    slots = Slots(t, 2, "cl", None, None, None, None, None)  # type: ignore[arg-type]
    slots.held[1] = Slot(1, {TopicPartition(t.input, 1): 7})
    out = stepped({"r1": "0.5", "r2": "0.25"})
    slots.spend = LaneSpend(None)
    commit = slots.commit_of(1, {1: out}, {1: LaneReport(5)}, 1.0)
    deaths = [r for r in commit.records if r.topic == t.limit_deaths]
    kinds = [orjson.loads(r.value or b"").get("kind", "lane") for r in deaths]
    assert kinds == ["budget_spend", "lane"]  # the report says everything before it was sent
    assert deaths[0].key == b"spend:acme" and deaths[0].partition == 0
    rows = orjson.loads(deaths[0].value or b"")["rows"]
    assert sorted((r[0], r[12]) for r in rows) == [("r1:1", "0.5"), ("r2:1", "0.25")]
    slots.spend = None  # budgets off: no spend records
    assert [
        r for r in slots.commit_of(1, {1: out}, {}, 1.0).records if r.topic == t.limit_deaths
    ] == []


class _Price:
    def __init__(self, kind: str, unit: str) -> None:
        self.provider, self.model, self.token_kind, self.currency = (
            "anthropic", "claude-sonnet-4-5", kind, "USD")  # fmt: skip
        self.valid_from = datetime(2026, 1, 1, tzinfo=UTC)
        self.unit_price, self.per_tokens = Decimal(unit), 1_000_000


def test_lane_spend_prices_by_the_book_rereads_it_and_survives_an_unreadable_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    reads: list[int] = []
    book: list[Any] = [_Price("input", "3"), _Price("output", "15")]

    def prices() -> list[Any]:
        reads.append(1)
        if len(reads) == 2:
            raise RuntimeError("prices table missing")
        return list(book)

    spend = LaneSpend(prices, refresh_s=60, clock=lambda: now[0])
    assert spend(Output()) == [] and reads == []  # no usage rows: the book is not read
    out = stepped({"r1": ""})  # reported without a cost: the book prices it

    def cost() -> Any:
        (rec,) = spend(out)
        amount, currency, priced_by = orjson.loads(rec.value or b"")["rows"][0][12:15]
        return [str(Decimal(amount).normalize()), currency, priced_by]

    # 1000 input at 3 and 100 output at 15 per million
    assert cost() == ["0.0045", "USD", "price_book"] and len(reads) == 1
    now[0] = 30
    assert cost() == ["0.0045", "USD", "price_book"] and len(reads) == 1  # not due again
    now[0] = 61
    with caplog.at_level(logging.WARNING, logger="prism.worker"):
        assert cost() == ["0.0045", "USD", "price_book"]  # the book read before stays
    assert "prices table missing" in caplog.text and len(reads) == 2
    book[:] = [_Price("input", "6"), _Price("output", "30")]
    now[0] = 130
    assert cost() == ["0.009", "USD", "price_book"]
    assert orjson.loads(LaneSpend(None)(out)[0].value or b"")["rows"][0][12:15] == [
        None, None, "unpriced"]  # fmt: skip


def test_the_budgets_file_setting_names_a_bad_file_and_adds_the_topics(
    tmp_path: Path,
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(BUDGETS.replace('timezone = "UTC"', 'timezone = "Europe/Berln"'))
    with pytest.raises(SettingsError, match=r"PRISM_BUDGETS_FILE=.*'Europe/Berln' is not an IANA"):
        load_settings(budgets_file=bad)
    assert load_settings(budgets_file="").budgets_file is None
    s = load_settings(budgets_file=budgets_file(tmp_path), topic_prefix="staging")
    assert s.topics.budget_state == "staging.budget-state"
