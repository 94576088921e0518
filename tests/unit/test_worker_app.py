"""The worker's commit sequence, slots and fencing, driven without a broker.

The group consumer and the transactional producers are fakes with the worker's own
interfaces (``GroupConsumer``, ``Transactions``); the fake transactions keep what was
committed the way Kafka would (state topic partitions as compacted maps, the group's
committed offsets with their metadata), so a slot restored by another worker reads what
this one committed. Everything lands on one timeline, so the assertions are about what
happened in which order:

- a batch's transaction (outputs, state, slot position, offsets) comes after its rows
  are in the ledger;
- a fenced transaction drops the slot and its lanes; nothing of it is visible;
- a slot kept through a rebalance is not read back unless someone committed for it since;
- records below a slot's position are skipped, and a fetch that begins past it is
  completed by a read-back before it is stepped.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Collection
from datetime import datetime
from typing import Any

import orjson
import pytest
from aiokafka import TopicPartition

from prism.pipeline.core import InRecord, home_partition
from prism.pipeline.core._run import to_us
from prism.pipeline.settings import Settings
from prism.pipeline.worker._app import PipelineWorker
from prism.pipeline.worker._checkpoint import Fenced, Lost, SlotCommit
from prism.pipeline.worker._consumer import CoPartitioningError, Fetched, check_copartitioned
from prism.pipeline.worker._lanes import CHANNEL_LANE
from prism.pipeline.worker._slotstate import KEY, SlotState
from prism.runtime.simulator import FleetConfig, simulate


class _Broker:
    """What Kafka keeps: compacted state partitions and the group's committed offsets."""

    def __init__(self) -> None:
        self.state: dict[tuple[str, int], dict[bytes, bytes]] = {}
        self.committed: dict[TopicPartition, tuple[int, str]] = {}
        self.ends: dict[tuple[str, int], int] = {}  # (topic, partition) -> its end offset
        self.steps: list[tuple[str, Any]] = []
        self.owner: dict[str, object] = {}  # slot -> the Transactions that opened it last


class _Transactions:
    def __init__(self, broker: _Broker) -> None:
        self.broker = broker
        self.producers: dict[str, object] = {}
        self.gate: asyncio.Event | None = None  # set: commits wait for it (a broker away)
        self.waiting = asyncio.Event()  # a commit waits at the gate
        # slot -> whether its next commit lands: either way it raises ``Lost`` (a broker
        # away, the outcome unknown to the worker)
        self.lose: dict[str, bool] = {}

    async def open(self, slot: str) -> None:
        self.producers[slot] = object()
        self.broker.owner[slot] = self  # fences every earlier producer of the slot

    async def close(self, slot: str) -> None:
        self.producers.pop(slot, None)

    async def close_all(self) -> None:
        self.producers.clear()

    async def commit(self, slot: str, commit: SlotCommit, metadata: str) -> None:
        if self.gate is not None:  # a fence meanwhile aborts it, as Kafka's epoch bump does
            self.waiting.set()
            await self.gate.wait()
        if self.broker.owner.get(slot) is not self or slot not in self.producers:
            raise Fenced(f"slot {slot}: fenced")
        lands = self.lose.pop(slot, None)
        if lands is False:
            raise Lost(f"slot {slot}: the transaction did not end in 20s")
        await asyncio.sleep(0)
        produced = self._append(commit.records)
        if commit.tail is not None:  # sent once the brokers acknowledged the rest
            tail = commit.tail(produced)
            produced.update(self._append(tail))
            commit = SlotCommit([*commit.records, *tail], commit.offsets)
        self.broker.steps.append(("txn", (slot, commit)))
        for r in commit.records:
            if r.topic.endswith("-changelog"):
                part = self.broker.state.setdefault((r.topic, r.partition or 0), {})
                if r.value is None:
                    part.pop(r.key or b"", None)
                else:
                    part[r.key or b""] = r.value
        for tp, offset in commit.offsets.items():
            self.broker.committed[tp] = (offset, metadata)
        if lands:
            raise Lost(f"slot {slot}: its producer died on a lost connection")
        return produced

    def _append(self, records: Collection[Any]) -> dict[tuple[str, int], int]:
        """The offset of the last of ``records`` in each (topic, partition) they name."""
        last = {}
        for r in records:
            if r.partition is not None:
                key = (r.topic, r.partition)
                last[key] = self.broker.ends.get(key, 0)
                self.broker.ends[key] = last[key] + 1
        return last


class _Consumer:
    def __init__(self, broker: _Broker) -> None:
        self.broker = broker
        self.epoch = 0
        self.sought: dict[TopicPartition, int] = {}
        self.ends: dict[TopicPartition, int] = {}
        self.paused: set[TopicPartition] = set()

    async def start(self, topics: Collection[str], handler: Any) -> None: ...

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.sought[tp] = offset

    def pause(self, tps: Collection[TopicPartition]) -> None:
        self.paused |= set(tps)

    def resume(self, tps: Collection[TopicPartition]) -> None:
        self.paused -= set(tps)

    def assignment(self) -> set[TopicPartition]:
        return set()

    def highwater(self, tp: TopicPartition) -> int | None:
        return self.ends.get(tp)

    async def positions(self, tps: Collection[TopicPartition]) -> dict[TopicPartition, int]:
        return {}

    async def end_offsets(self, tps: Collection[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self.ends.get(tp, 0) for tp in tps}

    async def beginning_offsets(self, tps: Collection[TopicPartition]) -> dict[TopicPartition, int]:
        return dict.fromkeys(tps, 0)

    async def committed(
        self, tps: Collection[TopicPartition]
    ) -> dict[TopicPartition, tuple[int, str]]:
        return {tp: self.broker.committed[tp] for tp in tps if tp in self.broker.committed}

    async def stop(self) -> None: ...


class _Writer:
    def __init__(self, broker: _Broker) -> None:
        self.broker = broker
        self.pending: list[Any] = []

    def add(self, batch: Any, *sources: Any) -> None:
        self.pending.append((len(batch), sources))

    def flush(self) -> None:
        for rows, sources in self.pending:
            self.broker.steps.append(("ledger", (rows, [s.last_offset for s in sources])))
        self.pending.clear()

    def discard(self) -> int:
        return 0


def _worker(tmp_path: Any, broker: _Broker, name: str = "a", partitions: int = 1) -> PipelineWorker:
    settings = Settings(
        state_dir=tmp_path / name,
        partitions=partitions,
        progress_interval_seconds=0,
        undelivered_read_back_seconds=0,
    )
    w = PipelineWorker(
        settings,
        _Writer(broker),
        clock=lambda: 1_800_000_000.0,
        consumer=_Consumer(broker),
        transactions=_Transactions(broker),  # type: ignore[arg-type]
    )

    async def read_many(partitions: Any) -> dict[int, dict[bytes, bytes]]:
        broker.steps.append(("restore", sorted(partitions)))
        return {p: dict(broker.state.get((w.slots.changelog, p), {})) for p in partitions}

    w.slots.reader.read_many = read_many  # type: ignore[method-assign]
    return w


def _slot(w: PipelineWorker, p: int) -> set[TopicPartition]:
    return set(w.slots.tps(p))


async def _assign(w: PipelineWorker, tps: set[TopicPartition]) -> None:
    """The group's assignment callback, then the loop's take-over of it."""
    await w.assigned(tps)
    await w.take_over()


def _records(topic: str, runs: int = 30) -> list[InRecord]:
    fleet = simulate(FleetConfig(runs=runs, seed=5))
    return [InRecord(r.value, topic, 0, i, r.key, None) for i, r in enumerate(fleet.records)]


def _one(tmp_path: Any) -> tuple[_Broker, PipelineWorker, list[InRecord], TopicPartition]:
    """Worker ``a`` on a broker of its own, a fleet's records and input partition 0."""
    broker = _Broker()
    w = _worker(tmp_path, broker)
    return broker, w, _records(w.topics.input), TopicPartition(w.topics.input, 0)


def _two(
    tmp_path: Any,
) -> tuple[_Broker, PipelineWorker, PipelineWorker, list[InRecord], TopicPartition]:
    """Workers ``a`` and ``b`` on one broker, a fleet's records and input partition 0."""
    broker = _Broker()
    a, b = _worker(tmp_path, broker, "a"), _worker(tmp_path, broker, "b")
    return broker, a, b, _records(a.topics.input), TopicPartition(a.topics.input, 0)


def _txns(broker: _Broker) -> list[tuple[str, SlotCommit]]:
    return [step for kind, step in broker.steps if kind == "txn"]


def _one_batch(tmp_path: Any) -> tuple[_Broker, PipelineWorker, list[InRecord], TopicPartition]:
    """A worker assigned slot 0 that stepped and committed one batch of a fleet."""
    broker, w, recs, tp = _one(tmp_path)

    async def go() -> None:
        await _assign(w, _slot(w, 0))
        await w._batch({tp: recs})

    asyncio.run(go())
    return broker, w, recs, tp


def test_a_batch_commits_its_outputs_state_position_and_offsets_after_the_ledger(
    tmp_path: Any,
) -> None:
    broker, w, recs, tp = _one_batch(tmp_path)
    kinds = [kind for kind, _ in broker.steps]
    assert kinds[:3] == ["restore", "ledger", "txn"]
    [(slot, commit)] = _txns(broker)
    assert slot == "0"
    assert commit.offsets[tp] == len(recs)  # the next offset to read
    by_topic: dict[str, list[Any]] = {}
    for r in commit.records:
        by_topic.setdefault(r.topic, []).append(r)
    assert by_topic[w.topics.runs_closed], "closed runs travel in the transaction"
    position = [r for r in by_topic[w.slots.changelog] if r.key == KEY]
    assert SlotState.from_bytes(position[0].value or b"").positions[tp.topic] == len(recs)
    assert all(r.partition == 0 for r in by_topic[w.slots.changelog])
    marks = [orjson.loads(r.value or b"") for r in by_topic[w.topics.lane_marks]]
    assert [m["lane"] for m in marks] == [0, 1 << 16]  # its agent-event and channel lanes
    meta = broker.committed[tp][1]
    assert meta.startswith(w.checkpoint.token) and w.slots.held[0].token == meta


def test_records_below_the_position_are_skipped_and_a_gap_is_read_back(tmp_path: Any) -> None:
    broker, w, recs, tp = _one(tmp_path)
    read: list[tuple[int, int]] = []

    async def read_back(partition: int, ranges: list[tuple[int, int]]) -> list[InRecord]:
        read.extend(ranges)
        return [r for r in recs if any(a <= r.offset < b for a, b in ranges)]

    w.watch.readers[tp.topic].read = read_back  # type: ignore[method-assign]

    async def go() -> None:
        await _assign(w, _slot(w, 0))
        await w._batch({tp: recs[:20]})
        await w._batch({tp: recs[10:15] + recs[30:40]})  # a re-delivery, then a jump

    asyncio.run(go())
    assert read == [(20, 30)]
    assert w.slots.held[0].positions[tp] == 40
    stepped = [r for kind, r in broker.steps if kind == "ledger"]
    assert stepped, "both batches reached the ledger"
    assert w.stats["offsets_read_back"] == 10


def test_a_fenced_slot_is_dropped_and_its_next_owner_restores_what_was_committed(
    tmp_path: Any,
) -> None:
    broker, a, b, recs, tp = _two(tmp_path)

    async def go() -> None:
        await _assign(a, _slot(a, 0))
        await a._batch({tp: recs[:40]})
        await _assign(b, _slot(b, 0))  # a paused past its session: b took slot 0 over
        await a._batch({tp: recs[40:]})  # the zombie wakes up

    asyncio.run(go())
    assert a.checkpoint.fenced_writes == 1
    assert 0 not in a.slots.held and not a.intake.lane(0)
    assert [s for s, _ in _txns(broker)] == ["0"]  # only the first batch's transaction
    assert broker.committed[tp][0] == 40
    assert b.slots.held[0].positions[tp] == 40  # restored from a's committed position
    assert b.intake.lane(0), "b restored slot 0's runs from the state a committed"


def test_a_slot_fenced_but_still_assigned_is_taken_back_after_the_wait(tmp_path: Any) -> None:
    """A transaction that outlived the broker's transaction timeout fences its producer
    without a rebalance: the slot must not stay unread for good."""
    broker, w, recs, tp = _one(tmp_path)

    async def go() -> tuple[list[int], list[int]]:
        await _assign(w, _slot(w, 0))
        await w._batch({tp: recs[:20]})
        broker.owner["0"] = object()  # the coordinator bumped the epoch: fenced
        await w._batch({tp: recs[20:]})
        assert 0 not in w.slots.held
        early = await w.slots.reclaim(_slot(w, 0), after_s=60.0)
        late = await w.slots.reclaim(_slot(w, 0), after_s=0.0)
        return early, late

    early, late = asyncio.run(go())
    assert (early, late) == ([], [0])  # not before the wait; then taken back
    assert w.slots.held[0].positions[tp] == 20  # restored from the last commit
    assert w.consumer.sought[tp] == 20  # type: ignore[attr-defined]
    assert w.checkpoint.fenced_writes == 1 and not w.slots.fenced_at


@pytest.mark.parametrize("lands", [False, True], ids=["aborted", "committed"])
def test_a_slot_lost_without_a_fence_is_taken_back_at_once_if_still_assigned(
    tmp_path: Any, lands: bool
) -> None:
    """A transaction whose outcome the worker cannot know (it did not end in time, or
    the producer died on a lost connection) shows no newer owner: the slot is taken back
    at the next look, not after the wait for a rebalance, from what was committed,
    whichever way the transaction ended. The group's word still decides: a lost slot
    it no longer assigns here is not taken back."""
    broker, w, recs, tp = _one(tmp_path)
    txns = w.transactions
    assert isinstance(txns, _Transactions)

    async def go() -> list[int]:
        await _assign(w, _slot(w, 0))
        await w._batch({tp: recs[:20]})
        txns.lose["0"] = lands
        await w._batch({tp: recs[20:40]})
        assert 0 not in w.slots.held and w.checkpoint.fenced_writes == 1
        back = await w.slots.reclaim(_slot(w, 0), after_s=60.0)
        await w._batch({tp: recs[broker.committed[tp][0] :]})
        return back

    assert asyncio.run(go()) == [0]
    assert not w.slots.fenced_at
    assert w.consumer.sought[tp] == (40 if lands else 20)  # type: ignore[attr-defined]
    assert broker.committed[tp][0] == len(recs)
    assert w.slots.held[0].positions[tp] == len(recs)

    broker, w, recs, tp = _one(tmp_path / "moved")
    txns = w.transactions
    assert isinstance(txns, _Transactions)

    async def moved() -> list[int]:
        await _assign(w, _slot(w, 0))
        txns.lose["0"] = lands
        await w._batch({tp: recs[:20]})
        return await w.slots.reclaim(_slot(w, 1), after_s=60.0)  # slot 0 is elsewhere now

    assert asyncio.run(moved()) == [] and 0 not in w.slots.held and not w.slots.fenced_at


def test_a_slot_kept_through_a_rebalance_is_read_back_only_if_someone_committed_since(
    tmp_path: Any,
) -> None:
    broker, a, b, recs, tp = _two(tmp_path)

    async def go() -> list[str]:
        await _assign(a, _slot(a, 0))
        await a._batch({tp: recs[:20]})
        await a.revoked(_slot(a, 0))
        await _assign(a, _slot(a, 0))  # the same slot back: kept, nothing read
        restores = [str(s) for k, s in broker.steps if k == "restore"]
        await a.revoked(_slot(a, 0))
        await _assign(b, _slot(b, 0))
        await b._batch({tp: recs[20:30]})
        await b.revoked(_slot(b, 0))
        await _assign(a, _slot(a, 0))  # back to a, but b committed in between
        return restores

    restores_before = asyncio.run(go())
    assert restores_before == ["[0]"]
    assert a.slots.kept == 1
    restores = [s for k, s in broker.steps if k == "restore"]
    assert len(restores) == 3  # a's first, b's, a's second (b committed for it)
    assert a.slots.held[0].positions[tp] == 30
    assert a.consumer.sought[tp] == 30  # type: ignore[attr-defined]


def _slow_batch(
    w: PipelineWorker, records: list[InRecord]
) -> tuple[asyncio.Future[float], asyncio.Event]:
    """The loop's batch in hand (``_work``, no tick due) with its commit held at a gate."""
    txns: _Transactions = w.transactions  # type: ignore[assignment]
    gate = txns.gate = asyncio.Event()
    tp = TopicPartition(records[0].source, records[0].partition)
    work = asyncio.ensure_future(w._work(Fetched(0, {tp: records}), float("inf")))
    return work, gate


def test_a_revocation_does_not_wait_for_the_batch_in_hand_and_the_slot_is_kept_after_it(
    tmp_path: Any,
) -> None:
    """Every member's rejoin waits on the revocation callback: with it waiting for a batch
    whose commit a broker restart slowed, the whole group stood still for 15 s in a soak.
    The batch commits after the rebalance, and the same slot back is kept with it."""
    broker = _Broker()
    a = _worker(tmp_path, broker, "a")
    recs = _records(a.topics.input)
    tp = TopicPartition(a.topics.input, 0)

    async def go() -> tuple[bool, list[str]]:
        await _assign(a, _slot(a, 0))
        work, gate = _slow_batch(a, recs[:20])
        await asyncio.wait_for(a.transactions.waiting.wait(), 5)  # type: ignore[attr-defined]
        await asyncio.wait_for(a.revoked(_slot(a, 0)), 1)  # the batch still in hand
        in_hand = not work.done()
        await a.assigned(_slot(a, 0))  # the group gives the same slot back
        gate.set()
        await work
        await a.take_over()
        return in_hand, [k for k, _ in broker.steps]

    in_hand, kinds = asyncio.run(go())
    assert in_hand
    assert kinds.count("restore") == 1 and kinds[-1] == "txn"  # kept: nothing read back
    assert a.slots.kept == 1 and a.slots.held[0].positions[tp] == 20
    assert broker.committed[tp] == (20, a.slots.held[0].token)


def test_a_batch_whose_slot_moved_while_in_hand_is_fenced_and_the_new_owner_restores(
    tmp_path: Any,
) -> None:
    """The zombie's case, on purpose: the slot's new owner opens its producer while the
    old owner's batch is still in hand; the old commit fails fenced, nothing of it is
    visible, the new owner resumes from the last commit, and the old owner drops the slot."""
    broker, a, b, recs, tp = _two(tmp_path)

    async def go() -> None:
        await _assign(a, _slot(a, 0))
        await a._batch({tp: recs[:10]})
        work, gate = _slow_batch(a, recs[10:30])
        await asyncio.wait_for(a.transactions.waiting.wait(), 5)  # type: ignore[attr-defined]
        await asyncio.wait_for(a.revoked(_slot(a, 0)), 1)
        await a.assigned(set())
        await _assign(b, _slot(b, 0))  # b's producer fences a's
        gate.set()
        await work
        await a.take_over()

    asyncio.run(go())
    assert a.checkpoint.fenced_writes == 1
    assert a.slots.held == {} and a.slots._parked == {}
    assert b.slots.held[0].positions[tp] == 10  # a's second batch is not visible
    assert broker.committed[tp][0] == 10
    assert [c.offsets[tp] for _, c in _txns(broker)] == [10]


def test_a_batch_or_tick_that_holds_the_lock_too_long_is_logged(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A slot assigned meanwhile waits for it: the log says how long, which slots, and
    what it waited on."""
    _, w, recs, tp = _one(tmp_path)

    async def slow_positions(tps: Collection[TopicPartition]) -> dict[TopicPartition, int]:
        await asyncio.sleep(0.15)
        return {}

    async def go() -> None:
        await _assign(w, _slot(w, 0))
        await w._work(Fetched(0, {tp: recs[:20]}), float("inf"))  # within the target
        quiet = [r.getMessage() for r in caplog.records if "took" in r.getMessage()]
        assert quiet == []
        w.pace.target_s = 1e-6
        w.consumer.positions = slow_positions  # type: ignore[method-assign]
        await w._work(Fetched(0, {tp: recs[20:30]}), 0.0)  # and the tick is due

    with caplog.at_level("WARNING", logger="prism.worker"):
        asyncio.run(go())
    slow = [r.getMessage() for r in caplog.records if " took " in r.getMessage()]
    assert len(slow) == 2, slow
    assert slow[0].startswith("a batch of 10 records took ") and "(slots held [0]): " in slow[0]
    assert slow[1].startswith("the timer's tick took ")
    assert "(slots held [0]): positions 0." in slow[1]  # the longest part first
    assert "; the lanes' tick wrote " in slow[1]  # and what it did


def test_a_restored_slot_seeks_every_partition_to_where_it_resumes(tmp_path: Any) -> None:
    """Committed or from the log's start, the worker says where each partition resumes:
    a position left for the consumer to look up itself is unknown until it has, and the
    tick's questions about it waited meanwhile."""
    broker, w, _, tp = _one(tmp_path)
    copies = TopicPartition(w.topics.repartition, 0)
    broker.committed = {tp: (7, "t"), copies: (3, "t")}  # no state stored: committed only

    asyncio.run(_assign(w, _slot(w, 0)))

    positions = w.slots.held[0].positions
    assert positions[tp] == 7 and positions[copies] == 3
    assert set(positions) == _slot(w, 0)  # the channel topics: from the log's start
    assert w.consumer.sought == positions  # type: ignore[attr-defined]


def test_the_assignment_callback_only_pauses_and_the_loop_takes_the_slots_over(
    tmp_path: Any,
) -> None:
    """aiokafka heartbeats only after the callback returns: a restore inside it outlasted
    the session under load and the group rebalanced again and again."""
    broker = _Broker()
    w = _worker(tmp_path, broker)
    tps = _slot(w, 0)

    async def go() -> tuple[list[str], set[TopicPartition], dict[int, Any]]:
        await w.assigned(tps)
        in_callback = [k for k, _ in broker.steps]
        paused = set(w.consumer.paused)  # type: ignore[attr-defined]
        held = dict(w.slots.held)
        await w.take_over()
        return in_callback, paused, held

    in_callback, paused, held = asyncio.run(go())
    assert in_callback == [] and held == {}  # nothing read or opened in the callback
    assert paused == tps
    assert "restore" in [k for k, _ in broker.steps] and set(w.slots.held) == {0}
    assert w.consumer.paused == set()  # type: ignore[attr-defined]


def test_an_assignment_revoked_before_its_take_over_is_void(tmp_path: Any) -> None:
    broker = _Broker()
    w = _worker(tmp_path, broker)

    async def go() -> None:
        await w.assigned(_slot(w, 0))
        await w.revoked(_slot(w, 0))  # the group moved on before the loop came round
        await w.take_over()

    asyncio.run(go())
    assert w.slots.held == {} and [k for k, _ in broker.steps] == []


def test_a_tick_while_a_slot_is_parked_leaves_its_lanes_alone(tmp_path: Any) -> None:
    """Between a revocation and the next assignment the timer still ticks. It ticked the
    parked slot's lanes too: runs closed in memory, their rows stored, but the slot's
    transaction was skipped (not held); the slot, kept at the assignment, never produced
    those deaths again (24 limit deaths missing in a chaos soak, and wrong alerts)."""
    broker = _Broker()
    w = _worker(tmp_path, broker)
    tp = TopicPartition(w.topics.input, 0)

    async def go() -> tuple[list[str], dict[int, float | None]]:
        await _assign(w, _slot(w, 0))
        await w._batch({tp: _records(w.topics.input)})
        await w.revoked(_slot(w, 0))
        lanes = sorted(w.slots._parked[0].lanes)
        before = {lane: w.intake.ticked_at.get(lane) for lane in lanes}
        steps = len(broker.steps)
        w.clock = lambda: 1_800_000_100.0  # processing time moves on: grace is due
        await w._tick()
        parked = {lane: w.intake.ticked_at.get(lane) for lane in lanes}
        new_steps = [kind for kind, _ in broker.steps[steps:]]
        await _assign(w, _slot(w, 0))  # kept: the same slot back, nobody committed since
        await w._tick()
        after = {lane: w.intake.ticked_at.get(lane) for lane in lanes}
        assert parked == before, (parked, before)
        return new_steps, after

    while_parked, after = asyncio.run(go())
    assert while_parked == []  # no rows stored, no transaction
    assert all(after[lane] == 1_800_000_100.0 for lane in after)  # ticked once held again
    assert w.slots.kept == 1


def test_an_event_that_would_outgrow_a_changelog_record_is_dead_lettered(tmp_path: Any) -> None:
    """Rule 15: a run whose state would not fit in one record must not stop the partition."""
    from tests.fixtures.runs import RunBuilder

    broker = _Broker()
    w = _worker(tmp_path, broker)
    b = RunBuilder("big").started()
    for _ in range(3):  # each under max_event_bytes; their facts together are not
        b.add("custom.blob", {"notes": "x" * 700_000})
    b.finished()
    small = RunBuilder("small").started().finished()
    values = [orjson.dumps(e) for e in b.events + small.events]
    recs = [InRecord(v, w.topics.input, 0, i, None, None) for i, v in enumerate(values)]
    tp = TopicPartition(w.topics.input, 0)

    async def go() -> None:
        await _assign(w, _slot(w, 0))
        await w._batch({tp: recs})

    asyncio.run(go())
    [(_, commit)] = _txns(broker)
    dlq = [r for r in commit.records if r.topic == w.topics.dlq]
    assert [r.value for r in dlq] == [values[3]]  # the blob that would take it over the limit
    headers = dict(dlq[0].headers)
    assert headers["reason-code"] == b"unstorable"
    assert b"changelog record" in headers["reason"] and b"'big'" in headers["reason"]
    state = [r for r in commit.records if r.topic == w.slots.changelog]
    assert max(len(r.value or b"") for r in state) <= w.settings.max_state_bytes
    assert commit.offsets[tp] == len(recs)


def _forwarding(tmp_path: Any, broker: _Broker) -> tuple[PipelineWorker, list[InRecord], Any]:
    """Worker ``a`` on 4 partitions, holding slot 0, after one batch of a fleet whose every
    record came on partition 0, whatever its home: its records and its one transaction."""
    w = _worker(tmp_path, broker, "a", partitions=4)
    recs = _records(w.topics.input)
    tp = TopicPartition(w.topics.input, 0)

    async def go() -> None:
        await _assign(w, _slot(w, 0))
        await w._batch({tp: recs})

    asyncio.run(go())
    [(slot, commit)] = _txns(broker)
    assert slot == "0"
    return w, recs, commit


def test_records_off_home_are_forwarded_in_their_source_offsets_transaction(
    tmp_path: Any,
) -> None:
    w, recs, commit = _forwarding(tmp_path, _Broker())
    tp = TopicPartition(w.topics.input, 0)
    copies = [r for r in commit.records if r.topic == w.topics.repartition]
    homes = {home_partition(r.key or b"", 4) for r in copies}
    assert copies and homes <= {1, 2, 3}, homes  # partition 0's own runs stay
    assert commit.offsets[tp] == len(recs)  # and the source offsets go with the copies
    runs_here = {r.key for r in commit.records if r.topic == w.topics.runs_closed}
    assert runs_here and all(home_partition(k, 4) == 0 for k in runs_here)
    assert w.slots.forwarded_from[0] == len(copies)
    assert {dict(r.headers)["source-partition"] for r in copies} == {b"0"}


def test_copies_in_flight_outlive_the_process_that_sent_them(tmp_path: Any) -> None:
    """A process forwards copies and dies before their home applied them: the next owner
    of the slot they came from reads them with its position record and holds the
    watermark at their time, in its reports too, until each home's repartition position
    is past the last copy sent there. (A soak lost a duplicate claim to a run that shrank
    while its copy waited, after the process that forwarded it was killed.)"""
    broker = _Broker()
    a, _, commit = _forwarding(tmp_path, broker)
    copies = [r for r in commit.records if r.topic == a.topics.repartition]
    homes = sorted({r.partition for r in copies if r.partition is not None})
    earliest = {h: min(to_us(datetime.fromisoformat(orjson.loads(r.value)["ts"]))
                       for r in copies if r.partition == h) for h in homes}  # fmt: skip
    last = {h: broker.ends[(a.topics.repartition, h)] - 1 for h in homes}
    assert homes == [1, 2, 3]
    assert a.slots.in_flight == {h: (earliest[h], last[h]) for h in homes}
    stored = SlotState.from_bytes(broker.state[(a.slots.changelog, 0)][KEY])
    assert stored.copies == a.slots.in_flight  # the record the tail wrote last

    b = _worker(tmp_path, broker, "b", partitions=4)  # ``a`` is gone; ``b`` takes slot 0
    asyncio.run(_assign(b, _slot(b, 0)))
    assert {h: b.intake.held(h) for h in homes} == earliest
    assert b.intake.clock.watermark_us <= min(earliest.values())
    reports = b.watch.reports(1_800_000_000.0, {})
    assert reports and {r.hold_us for r in reports.values()} == {min(earliest.values())}

    b.watch.release_copies({1: last[1] + 1, 2: last[2], 3: last[3] + 5})  # 2: not yet
    assert {h: b.intake.held(h) for h in homes} == {1: None, 2: earliest[2], 3: None}
    assert b.slots.in_flight == {2: (earliest[2], last[2])}
    b.watch.release_copies({2: last[2] + 1})
    assert b.intake.held(2) is None and not b.slots.in_flight
    commit_b = b.slots.commit_of(0, {}, {}, 1_800_000_000.0)
    state_b = SlotState.from_bytes([r.value for r in commit_b.records if r.key == KEY][-1] or b"")
    assert state_b.copies == {}  # released: the next owner inherits nothing


def test_copies_to_a_home_held_here_are_reported_too(tmp_path: Any) -> None:
    """A process that forwards copies to a home lane it holds itself reports their hold
    with its lanes all the same: if it dies before applying them, the home's next owner
    restores the home's position record (which may predate the forward) and has only the
    dead process's reports to tell it a copy of that time is still coming."""
    broker = _Broker()
    a = _worker(tmp_path, broker, "a", partitions=4)
    homes = {r.key: home_partition(r.key or b"", 4) for r in _records(a.topics.input)}
    recs = [r for r in _records(a.topics.input) if homes[r.key] in (0, 1)]
    tp = TopicPartition(a.topics.input, 0)

    async def go() -> None:
        await _assign(a, _slot(a, 0) | _slot(a, 1))  # slot 1: the home of every copy
        await a._batch({tp: recs})

    asyncio.run(go())
    copies = [r for _, c in _txns(broker) for r in c.records if r.topic == a.topics.repartition]
    to_one = [to_us(datetime.fromisoformat(orjson.loads(r.value)["ts"]))
              for r in copies if r.partition == 1]  # fmt: skip
    assert to_one and a.intake.held(1) is not None  # held here, its copies not applied yet
    marks = [r for _, c in _txns(broker) for r in c.records if r.topic == a.topics.lane_marks]
    reported = {orjson.loads(r.value)["lane"]: orjson.loads(r.value).get("hold") for r in marks}
    assert {r.partition for r in copies} == {1}
    assert reported[0] == min(to_one)

    z = _worker(tmp_path, broker, "z", partitions=4)  # ``a`` died; ``z`` holds slot 1 now
    for r in marks:
        z.marks.take(r.value)
    z.marks.apply(z.intake.clock, {1, CHANNEL_LANE + 1}, 1_800_000_000.0)
    assert z.intake.clock.watermark_us <= min(to_one)


def test_channel_operations_on_their_way_are_copies_in_flight_too(tmp_path: Any) -> None:
    """Channel operations forwarded to their home are held, kept in the position record,
    inherited and released as agent events are, on the home's channel lane
    (``CHANNEL_LANE`` + home) and its channel repartition position. (Only agent events
    held before: an operation's completion on its way could leave it flagged ``stuck``
    at a watermark past it.)"""
    broker = _Broker()
    a = _worker(tmp_path, broker, "a", partitions=4)
    fleet = simulate(FleetConfig(runs=2, seed=5, channel_operations=40))
    tp = TopicPartition(a.topics.channel_operations, 0)
    ops = [r for r in fleet.records if r.family == "channel"]
    recs = [InRecord(r.value, tp.topic, 0, i, r.key, None) for i, r in enumerate(ops)]

    async def go() -> None:
        await _assign(a, _slot(a, 0))
        await a._batch({tp: recs})

    asyncio.run(go())
    copies = [r for _, c in _txns(broker) for r in c.records
              if r.topic == a.topics.channel_repartition]  # fmt: skip
    lanes = sorted({CHANNEL_LANE + (r.partition or 0) for r in copies})
    earliest = {lane: min(to_us(datetime.fromisoformat(orjson.loads(r.value)["ts"]))
                          for r in copies if CHANNEL_LANE + (r.partition or 0) == lane)
                for lane in lanes}  # fmt: skip
    last = {lane: broker.ends[(a.topics.channel_repartition, lane - CHANNEL_LANE)] - 1
            for lane in lanes}  # fmt: skip
    assert lanes == [CHANNEL_LANE + h for h in (1, 2, 3)]
    assert a.slots.in_flight == {lane: (earliest[lane], last[lane]) for lane in lanes}
    assert a.intake.sent_hold() == min(earliest.values())
    stored = SlotState.from_bytes(broker.state[(a.slots.changelog, 0)][KEY])
    assert stored.copies == a.slots.in_flight

    b = _worker(tmp_path, broker, "b", partitions=4)  # ``a`` is gone; ``b`` takes slot 0
    asyncio.run(_assign(b, _slot(b, 0)))
    assert {lane: b.intake.held(lane) for lane in lanes} == earliest
    assert b.intake.clock.watermark_us <= min(earliest.values())
    first, *rest = lanes
    b.watch.release_copies({first: last[first]} | {lane: last[lane] + 1 for lane in rest})
    assert b.slots.in_flight == {first: (earliest[first], last[first])}  # not applied yet
    assert {lane: b.intake.held(lane) for lane in rest} == dict.fromkeys(rest)
    b.watch.release_copies({first: last[first] + 1})
    assert b.intake.held(first) is None and not b.slots.in_flight


def test_an_assignment_that_splits_a_slot_is_refused() -> None:
    topics = ("in", "ch", "in.r", "ch.r")
    whole = {TopicPartition(t, 1) for t in topics}
    assert check_copartitioned(whole | {TopicPartition("other", 0)}, topics) == {1: whole}
    with pytest.raises(CoPartitioningError, match=r"partition 2 of \['in'\].*'ch'"):
        check_copartitioned(whole | {TopicPartition("in", 2)}, topics)


def test_the_slot_position_record_is_versioned() -> None:
    state = SlotState(4, {"in": 10, "in.r": 3})
    assert SlotState.from_bytes(state.to_bytes()) == state
    flying = SlotState(4, {"in": 10}, 7, {2: (1_700_000_000_000_000, 41)})
    assert SlotState.from_bytes(flying.to_bytes()) == flying
    for bad in ({"x": [1, 2]}, {"2": [1]}, {"2": [1, "2"]}, [1]):
        raw = {"format": 1, "partitions": 4, "positions": {}, "copies": bad}
        with pytest.raises(ValueError, match="copies in flight"):
            SlotState.from_bytes(orjson.dumps(raw))
    with pytest.raises(ValueError, match="format 7"):
        SlotState.from_bytes(orjson.dumps({"format": 7, "partitions": 4, "positions": {}}))
    with pytest.raises(ValueError, match="not JSON"):
        SlotState.from_bytes(b"{")


def test_an_unchanged_report_is_sent_again_to_lane_marks_only(tmp_path: Any) -> None:
    # readers of lane-marks doubt an idle report older than the session timeout, so it is
    # repeated; the alerter keeps each lane's last report in its state and needs no repeat
    # (a repeat every few seconds on limit-deaths also kept its lag from ever settling)
    _, w, _, _ = _one_batch(tmp_path)
    now = 1_800_000_000.0  # the batch's commit sent both lanes' reports
    assert not w.watch.reports(now + 2, None)  # nothing changed, not due
    again = w.watch.reports(now + 60, None)  # due: sent again unchanged
    assert set(again) == w.watch.repeats == {0, 1 << 16}  # agent-event and channel lanes
    commit = w.slots.commit_of(0, {}, again, now + 60, w.watch.repeats)
    topics = [r.topic for r in commit.records]
    assert topics.count(w.topics.lane_marks) == len(again)
    assert w.topics.limit_deaths not in topics


def test_the_timer_tick_runs_without_automatic_collection_as_a_batch_does(tmp_path: Any) -> None:
    """A tick can decode thousands of runs; in a soak, 20 of a tick's 27 s were the
    collector walking them."""
    _, w, _, _ = _one(tmp_path)
    seen: list[bool] = []

    class Watched:  # the intake, its tick observed (a compiled Intake's methods are fixed)
        def __init__(self, intake: Any) -> None:
            self.__dict__["_intake"] = intake

        def __getattr__(self, name: str) -> Any:
            return getattr(self._intake, name)

        def __setattr__(self, name: str, value: Any) -> None:
            setattr(self._intake, name, value)

        def tick(self, *args: Any, **kwargs: Any) -> Any:
            seen.append(gc.isenabled())
            return self._intake.tick(*args, **kwargs)

    w.intake = Watched(w.intake)
    was = gc.isenabled()
    gc.enable()
    try:
        asyncio.run(_assign(w, _slot(w, 0)))
        asyncio.run(w._work(Fetched(0, {}), 0.0))  # no batch; the tick is due
        assert gc.isenabled()  # on again after it
    finally:
        if not was:
            gc.disable()
    assert seen == [False]
