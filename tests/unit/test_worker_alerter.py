"""The worker's alerter: decided rows out, its state as a record for its slot's transaction,
and the alerter as a process holds it (take-over, batches, markers, fence, give-up)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from aiokafka import TopicPartition

from prism.pipeline.core import InRecord, LaneReport, LimitDeath, death_record, lane_record
from prism.pipeline.core._run import to_us
from prism.pipeline.settings import Settings
from prism.pipeline.worker._alerter import STATE_KEY, AlertDesk
from prism.pipeline.worker._checkpoint import ALERTER, Fenced, Lost, SlotCommit

T0 = datetime(2026, 11, 30, tzinfo=UTC)


def _desk(tmp_path: Any, changelog: dict[bytes, bytes]) -> AlertDesk:
    settings = Settings(state_dir=tmp_path, partitions=1, alert_limit_deaths_threshold=2,
                        grace_period_seconds=0.0)  # fmt: skip
    desk = AlertDesk(settings, settings.core_config())

    async def read(partition: int) -> dict[bytes, bytes]:
        return dict(changelog)

    desk.reader.read = read  # type: ignore[method-assign]
    return desk


def _values(deaths: int, mark_s: float) -> list[bytes]:
    values = [
        death_record(LimitDeath("acme", "maxTurns", f"r{i}", T0 + timedelta(seconds=i))).value
        for i in range(deaths)
    ]
    mark = to_us(T0 + timedelta(seconds=mark_s))
    return [*values, lane_record(0, LaneReport(mark, None, idle=True), 1.0).value]


def test_the_desk_decides_at_the_watermark_and_its_next_holder_reads_its_state_back(
    tmp_path: Any,
) -> None:
    changelog: dict[bytes, bytes] = {}
    desk = _desk(tmp_path, changelog)

    async def go() -> None:
        assert desk.state_record() is None  # nothing stepped: nothing to write
        out = await desk.step(_values(2, 10), 0, 2)
        assert [r.state for r in out.ledger.alerts] == ["firing"]
        assert out.ranges == [(desk.topic, 0, 0, 2)] and len(out.alerts) == 1
        state = desk.state_record()
        assert state is not None
        assert (state.topic, state.key, state.partition) == (desk.changelog, STATE_KEY, 0)
        changelog[STATE_KEY] = state.value or b""  # the transaction committed it
        desk.forget()  # fenced or reassigned: the copy in memory is gone
        assert desk.alerter is None and desk.state_record() is None
        # the next holder reads the state back: the firing is not decided twice
        again = _desk(tmp_path, changelog)
        assert (await again.step(_values(2, 10), 0, 2)).ledger.alerts == []
        # without the state, the same deaths fire again: the state is what prevents it
        fresh = _desk(tmp_path, {})
        assert len((await fresh.step(_values(2, 10), 0, 2)).ledger.alerts) == 1

    asyncio.run(go())


class _Held:
    """The consumer, producers and checkpoint an alerter's holder talks to, as a log."""

    def __init__(self, committed: int | None, fenced: Fenced | None = None) -> None:
        self.committed_at = committed
        self.fenced = fenced  # what each commit raises, if any
        self.log: list[tuple[str, Any]] = []
        self.assigned: set[TopicPartition] = set()

    def assignment(self) -> set[TopicPartition]:
        return self.assigned

    async def committed(self, tps: Any) -> dict[TopicPartition, tuple[int, str]]:
        if self.committed_at is None:
            return {}
        return {tp: (self.committed_at, "w:1") for tp in tps}

    async def open(self, slot: str) -> None:
        self.log.append(("open", slot))

    async def close(self, slot: str) -> None:
        self.log.append(("close", slot))

    async def commit(self, commits: dict[str, SlotCommit]) -> dict[str, Fenced]:
        [(slot, commit)] = commits.items()
        self.log.append(("commit", (slot, dict(commit.offsets), len(commit.records))))
        return {} if self.fenced is None else {slot: self.fenced}

    def store(self, out: Any) -> None:
        self.log.append(("store", len(out.ledger.alerts)))

    async def send(self, rows: list[Any]) -> None:
        self.log.append(("send", len(rows)))


def _records(desk: AlertDesk, values: list[bytes], first: int) -> list[InRecord]:
    return [InRecord(v, desk.topic, 0, first + i) for i, v in enumerate(values)]


def test_a_holder_steps_from_the_committed_offset_and_commits_before_it_sends(
    tmp_path: Any,
) -> None:
    desk = _desk(tmp_path, {})
    held = _Held(committed=2)
    values = _values(2, 10)  # deaths at offsets 2 and 3, the lane's report at 4

    async def go() -> None:
        # not held: a stale fetch of the partition is not stepped
        assert (
            await desk.batch(_records(desk, values, 2), held, held.store, held.send)
        ).stats == {}
        assert held.log == []
        await desk.take(held, held)  # type: ignore[arg-type]
        assert desk.held and desk.position == 2 and held.log == [("open", ALERTER)]
        # offsets 0 and 1 were stepped by the last holder (a re-delivery): left out
        stale = [InRecord(b"{}", desk.topic, 0, 0), InRecord(b"{}", desk.topic, 0, 1)]
        out = await desk.batch([*stale, *_records(desk, values, 2)], held, held.store, held.send)  # type: ignore[arg-type]
        assert [r.state for r in out.ledger.alerts] == ["firing"]
        tp = TopicPartition(desk.topic, 0)
        # alert, alerter state: in the ledger, then in one transaction, then sent
        assert held.log[1:] == [("store", 1), ("commit", (ALERTER, {tp: 5}, 2)), ("send", 1)]
        assert desk.position == 5
        # the consumer moved past transaction markers: the offset alone is committed
        del held.log[:]
        await desk.markers(5, held)  # type: ignore[arg-type]
        assert held.log == []  # not past: nothing to commit
        await desk.markers(9, held)  # type: ignore[arg-type]
        assert held.log == [("commit", (ALERTER, {tp: 9}, 0))] and desk.position == 9
        await desk.give_up(held)  # type: ignore[arg-type]
        assert not desk.held and desk.alerter is None and held.log[-1] == ("close", ALERTER)

    asyncio.run(go())


def test_a_fenced_holder_lets_the_alerter_go_and_sends_nothing(tmp_path: Any) -> None:
    desk = _desk(tmp_path, {})
    held = _Held(committed=None, fenced=Fenced("slot alerter: fenced"))

    async def go() -> None:
        await desk.take(held, held)  # type: ignore[arg-type]
        assert desk.position is None  # nothing committed yet: from the first offset
        out = await desk.batch(_records(desk, _values(2, 10), 0), held, held.store, held.send)  # type: ignore[arg-type]
        assert len(out.ledger.alerts) == 1
        assert [kind for kind, _ in held.log] == ["open", "store", "commit"]  # no send
        assert not desk.held and desk.alerter is None  # read back by whoever holds it next
        await desk.markers(50, held)  # type: ignore[arg-type]
        assert [kind for kind, _ in held.log] == ["open", "store", "commit"]

    asyncio.run(go())


def test_an_alerter_fenced_or_lost_but_still_assigned_is_taken_back(tmp_path: Any) -> None:
    """As slots are (``Slots.reclaim``): a fenced alerter after the wait for a rebalance,
    a lost one (its commit's outcome unknown, no newer owner in sight) at once, and
    neither once the group assigns its partition elsewhere; else no process would page
    for limit deaths until the next rebalance."""
    desk = _desk(tmp_path, {})
    tp = TopicPartition(desk.topic, 0)

    async def fenced_then(why: Fenced, assigned: set[TopicPartition]) -> list[bool]:
        held = _Held(committed=3, fenced=why)
        held.assigned = assigned
        await desk.take(held, held)  # type: ignore[arg-type]
        await desk.batch(_records(desk, _values(2, 10), 3), held, held.store, held.send)  # type: ignore[arg-type]
        assert not desk.held and desk.fenced_at is not None
        held.fenced = None
        early = await desk.reclaim(held, held, after_s=60.0)  # type: ignore[arg-type]
        late = await desk.reclaim(held, held, after_s=0.0)  # type: ignore[arg-type]
        assert desk.fenced_at is None and desk.held == (early or late)
        if desk.held:
            assert desk.position == 3 and held.log[-1] == ("open", ALERTER)
        return [early, late]

    assert asyncio.run(fenced_then(Fenced("slot alerter: fenced"), {tp})) == [False, True]
    assert asyncio.run(fenced_then(Lost("slot alerter: did not end in 20s"), {tp})) == [
        True,
        False,
    ]
    assert asyncio.run(fenced_then(Lost("slot alerter: lost"), set())) == [False, False]
