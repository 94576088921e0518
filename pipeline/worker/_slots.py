"""The slots a worker process holds: their positions, their restore, their transactions.

A slot is partition ``p`` of the four topics the group assigns together
(``Topics.slot_topics``): the agent events and channel operations as published, and the
records forwarded to their home partition ``p`` (``<input>.repartition``,
``<channel-operations>.repartition``). Agent events of slot ``p`` are core lane ``p``,
channel operations lane ``CHANNEL_LANE + p`` (``_lanes``), whichever topic they came from.

On assignment (``Slots.assigned``, under the worker's lock, inside the group's
rebalance callback) every assigned slot gets a new transactional producer first, which
fences whoever wrote for it before (``_checkpoint``). Then each slot is either kept (this
process held it before the rebalance and the group's committed offsets still carry this
process's last commit token: nobody committed for it in between) or restored: its state
topic partition read back to its end, read committed (``_state.StateReader``), the lanes
loaded from it and each partition sought to the position in its ``SlotState``. Nothing
waits on a table recovery: a rebalance that keeps a slot costs one offsets request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field

from aiokafka import TopicPartition

from ..core import (
    Intake,
    LaneReport,
    Output,
    OutRecord,
    StateKey,
    death_record,
    lane_record,
)
from ..settings import Topics
from ._checkpoint import Checkpoint, Dropped, SlotCommit, Transactions
from ._consumer import GroupConsumer, check_copartitioned
from ._lanes import CHANNEL_LANE, source_of
from ._produce import ProducedRecord
from ._slotstate import KEY, SlotState, next_generation
from ._state import StateReader

__all__ = ["Slot", "Slots", "slot_of"]

log = logging.getLogger("prism.worker")


@dataclass(slots=True)
class Slot:
    """One held slot: the next offset to step of each of its partitions (known ones)."""

    partition: int
    positions: dict[TopicPartition, int] = field(default_factory=dict)
    token: str = ""  # the metadata of the group's last commit for it, as this process knows
    generation: int = 0  # this owner's (``_slotstate.next_generation``)

    @property
    def lanes(self) -> tuple[int, int]:
        return (self.partition, CHANNEL_LANE + self.partition)


def _add(copies: dict[int, tuple[int, int]], lane: int, ts: int, offset: int) -> None:
    """Count copies of ``lane`` (earliest event time ``ts``, last one at ``offset``) in
    ``copies``: the earliest time and the last offset of both."""
    was = copies.get(lane)
    copies[lane] = (ts, offset) if was is None else (min(was[0], ts), max(was[1], offset))


def slot_of(lane: int) -> int:
    """The slot (Kafka partition number) of a core lane."""
    return lane % CHANNEL_LANE


class Slots:
    """The slots this process holds (see the module docstring)."""

    def __init__(
        self,
        topics: Topics,
        partitions: int,
        changelog: str,
        intake: Intake,
        consumer: GroupConsumer,
        reader: StateReader,
        transactions: Transactions,
        checkpoint: Checkpoint,
    ) -> None:
        self.topics = topics
        self.partitions = partitions
        self.changelog = changelog
        self.intake = intake
        self.consumer = consumer
        self.reader = reader
        self.transactions = transactions
        self.checkpoint = checkpoint
        self.held: dict[int, Slot] = {}
        self._parked: dict[int, Slot] = {}  # revoked; kept if the next assignment allows
        self.restores: list[float] = []  # seconds each restore took
        self.kept = 0  # slots kept through a rebalance without reading their state
        self.forwarded_from: Counter[int] = Counter()  # source partition -> records forwarded
        self._patterns: set[str] = set()  # producer patterns warned about
        self.fenced_at: dict[int, Dropped] = {}  # slot -> when its commit was fenced
        # home lane -> (earliest event time, offset of the last copy) of the agent-event
        # copies this process forwarded (or inherited with a restored slot) and has not
        # seen applied: they hold the watermark until then (``_slotstate``, ``_watch``)
        self.in_flight: dict[int, tuple[int, int]] = {}
        self._sending: dict[int, dict[int, int]] = {}  # slot -> this commit's copies
        # a lane output's spend records for the budget desk (budgets on), before its report
        self.spend: Callable[[Output], list[OutRecord]] | None = None

    def lane_of(self, tp: TopicPartition) -> int | None:
        """The core lane of a slot topic's partition (None: not a slot topic)."""
        t = self.topics
        if tp.topic in (t.input, t.repartition):
            return tp.partition
        if tp.topic in (t.channel_operations, t.channel_repartition):
            return CHANNEL_LANE + tp.partition
        return None

    def lanes(self) -> set[int]:
        """The core lanes of the slots held."""
        return {lane for slot in self.held.values() for lane in slot.lanes}

    def repartition_of(self, lane: int) -> str:
        """The repartition topic that brings a lane its forwarded copies."""
        t = self.topics
        return t.channel_repartition if lane >= CHANNEL_LANE else t.repartition

    def forwarded(self, tp: TopicPartition) -> bool:
        return tp.topic in (self.topics.repartition, self.topics.channel_repartition)

    def tps(self, partition: int) -> list[TopicPartition]:
        return [TopicPartition(t, partition) for t in self.topics.slot_topics]

    # -- the group's callbacks ------------------------------------------------------------
    def revoked(self, tps: Iterable[TopicPartition]) -> None:
        for p in {tp.partition for tp in tps if tp.topic in self.topics.slot_topics}:
            slot = self.held.pop(p, None)
            if slot is not None:
                self._parked[p] = slot

    async def assigned(self, tps: Iterable[TopicPartition]) -> None:
        wanted = set(check_copartitioned(tps, self.topics.slot_topics))
        self.fenced_at.clear()  # whatever was fenced, the group has spoken since
        for p in sorted(set(self._parked) - wanted):  # another process's now
            await self.drop(p)
        await asyncio.gather(*(self.transactions.open(str(p)) for p in sorted(wanted)))
        all_tps = [tp for p in sorted(wanted) for tp in self.tps(p)]
        committed = await self.consumer.committed(all_tps)
        restore = []
        for p in sorted(wanted):
            parked = self._parked.pop(p, None) or self.held.pop(p, None)
            mine = {tp: committed[tp] for tp in self.tps(p) if tp in committed}
            if parked is not None and self._unchanged(parked, mine):
                self.held[p] = parked
                self.kept += 1
                for tp, offset in parked.positions.items():  # a fetch in hand is void
                    self.consumer.seek(tp, offset)
            else:
                if parked is not None:
                    log.info("slot %d: committed to by another process since; restoring", p)
                restore.append(p)
        if restore:
            await self._restore(restore, committed)

    def _unchanged(self, slot: Slot, committed: Mapping[TopicPartition, tuple[int, str]]) -> bool:
        """Whether the group's commits for ``slot`` are still the ones this process made."""
        return all(
            meta == slot.token and slot.positions.get(tp) == offset
            for tp, (offset, meta) in committed.items()
        )

    async def _restore(
        self, partitions: list[int], committed: Mapping[TopicPartition, tuple[int, str]]
    ) -> None:
        started = time.monotonic()
        states = await self.reader.read_many(partitions)
        read_s = time.monotonic() - started
        for p in partitions:  # parsing a large state takes seconds: off the event loop
            loading = time.monotonic()
            slot, stored = await asyncio.to_thread(self._rebuild, p, states.get(p, {}))
            load_s = time.monotonic() - loading
            for tp in self.tps(p):
                if stored is not None and tp.topic in stored.positions:
                    slot.positions[tp] = stored.positions[tp.topic]
                elif tp in committed:
                    slot.positions[tp] = committed[tp][0]
            unknown = [tp for tp in self.tps(p) if tp not in slot.positions]
            if unknown:  # nothing stored or committed: from the log's start
                slot.positions.update(await self.consumer.beginning_offsets(unknown))
            for tp, offset in slot.positions.items():  # the consumer looks up none itself
                self.consumer.seek(tp, offset)
            metas = {committed[tp][1] for tp in self.tps(p) if tp in committed}
            slot.token = metas.pop() if len(metas) == 1 else ""
            self.held[p] = slot
            if stored is not None:
                self.inherit(stored.copies)
            runs = sum(proc.size for lane in slot.lanes for proc in self.intake.lane(lane))
            log.info(
                "slot %d: restored %d runs or channel operations (%d state records of "
                "%d slots read in %.1fs, loaded in %.1fs)",
                p, runs, len(states.get(p, {})), len(partitions), read_s, load_s,
            )  # fmt: skip
        self.restores.append(time.monotonic() - started)

    def _rebuild(self, p: int, state: Mapping[bytes, bytes]) -> tuple[Slot, SlotState | None]:
        """Slot ``p``'s lanes loaded from its stored ``state`` (in a thread: the batch lock
        is held, so no step runs beside it)."""
        slot = Slot(p)
        raw = state.get(KEY)
        stored = SlotState.from_bytes(raw) if raw is not None else None
        if stored is not None and stored.partitions != self.partitions:
            raise RuntimeError(
                f"slot {p}'s state was written for {stored.partitions} input partitions, "
                f"the topic has {self.partitions}: see SCALING.md, changing the count"
            )
        by_lane: dict[int, list[tuple[str, bytes]]] = {}
        for k, v in state.items():
            parsed = StateKey.of(k)
            if parsed is not None:
                by_lane.setdefault(parsed.lane, []).append((str(parsed), v))
        slot.generation = next_generation(stored.generation if stored else 0, time.time())
        for lane in slot.lanes:
            self.intake.drop(lane)
            self.intake.load(lane, by_lane.get(lane, []))
            self.intake.set_generation(lane, slot.generation)
        return slot, stored

    async def drop(self, p: int) -> None:
        """Forget a slot this process no longer holds (or may not write for)."""
        self._parked.pop(p, None)
        self.held.pop(p, None)
        for lane in (p, CHANNEL_LANE + p):
            self.intake.drop(lane)
        await self.transactions.close(str(p))

    def figures(self) -> dict[str, object]:
        """The slots' figures for the worker's stats file."""
        return {
            "state_restore_s": [round(s, 3) for s in self.restores[-100:]],
            "slots_kept": self.kept,
            "forwarded": {str(p): n for p, n in sorted(self.forwarded_from.items())},
            "slots": sorted(self.held),
        }

    # -- commits ------------------------------------------------------------------------
    def commit_of(
        self,
        p: int,
        parts: Mapping[int, Output],
        reports: Mapping[int, LaneReport],
        at: float,
        repeats: Collection[int] = (),
    ) -> SlotCommit:
        """Slot ``p``'s share of a batch or tick as one transaction's content; the reports of
        ``repeats`` (sent again unchanged, so that lane-marks' readers do not doubt an idle
        lane) go to lane-marks only: the alerter keeps every lane's last report itself."""
        t = self.topics
        slot = self.held[p]
        recs: list[ProducedRecord] = []
        sent: dict[int, int] = {}  # home lane -> the earliest event time of its copies here
        for lane in slot.lanes:
            out = parts.get(lane)
            if out is not None:
                recs += [ProducedRecord(t.dlq, r.key, r.value, None, r.headers) for r in out.dlq]
                recs += [ProducedRecord(t.quarantine, r.key, r.value, None, r.headers)
                         for r in out.quarantined]  # fmt: skip
                recs += [ProducedRecord(t.runs_closed, r.key, r.value, None, r.headers)
                         for r in out.closed]  # fmt: skip
                recs += [ProducedRecord(t.alerts, r.key, r.value, None, r.headers)
                         for r in out.alerts]  # fmt: skip
                for death in out.limit_deaths:
                    r = death_record(death)
                    recs.append(ProducedRecord(t.limit_deaths, r.key, r.value, 0, r.headers))
                recs += [ProducedRecord(self.changelog, k.encode(), v, p)
                         for k, v in out.state_writes.items()]  # fmt: skip
                for f in out.forwards:  # to the home partition's repartition topic
                    topic = t.channel_repartition if f.channel else t.repartition
                    recs.append(ProducedRecord(topic, f.key, f.value, f.partition, f.headers))
                    home = self.intake.home_lane(f)
                    sent[home] = min(sent.get(home, f.ts_us), f.ts_us)
                for r in self.spend(out) if self.spend is not None else ():
                    recs.append(ProducedRecord(t.limit_deaths, r.key, r.value, 0))
            report = reports.get(lane)
            if report is not None:
                copies = slot.positions.get(TopicPartition(self.repartition_of(lane), p))
                r = lane_record(lane, report, at, copies)
                if lane not in repeats:
                    recs.append(ProducedRecord(t.limit_deaths, r.key, r.value, 0))
                recs.append(ProducedRecord(t.lane_marks, r.key, r.value, 0))
        positions = {tp.topic: o for tp, o in slot.positions.items()}
        state = SlotState(self.partitions, positions, slot.generation, dict(self.in_flight))
        recs.append(ProducedRecord(self.changelog, KEY, state.to_bytes(), p))
        if not sent:
            self._sending.pop(p, None)
            return SlotCommit(recs, dict(slot.positions))
        self._sending[p] = sent

        def tail(produced: Mapping[tuple[str, int], int]) -> list[ProducedRecord]:
            # the position record again, naming the offsets the copies took
            copies = self._merged(sent, {**self.checkpoint.produced, **produced})
            state = SlotState(self.partitions, positions, slot.generation, copies)
            return [ProducedRecord(self.changelog, KEY, state.to_bytes(), p)]

        return SlotCommit(recs, dict(slot.positions), tail)

    def _merged(
        self, sent: Mapping[int, int], produced: Mapping[tuple[str, int], int]
    ) -> dict[int, tuple[int, int]]:
        """``in_flight`` with the copies ``sent`` (home lane -> earliest event time) added,
        each home's last offset taken from ``produced``."""
        copies = dict(self.in_flight)
        for lane, ts in sent.items():
            last = produced.get((self.repartition_of(lane), slot_of(lane)), -1)
            _add(copies, lane, ts, last)
        return copies

    def inherit(self, copies: Mapping[int, tuple[int, int]]) -> None:
        """Copies in flight read with a restored slot (its last owner's): held here until
        seen applied, as if this process had sent them."""
        for lane, (ts, offset) in copies.items():
            _add(self.in_flight, lane, ts, offset)
            held = self.intake.held(lane)
            self.intake.hold(lane, ts if held is None else min(held, ts))

    def tick_output(self, outs: Mapping[int, Output]) -> Output:
        """The lanes' tick outputs as one, each lane's named by its source partition's
        position (the ledger's dedup token of a tick's rows)."""
        out = Output()
        for lane, part in outs.items():
            out.extend(part)
            tp = TopicPartition(*source_of(self.topics, lane))
            slot = self.held.get(tp.partition)
            offset = slot.positions.get(tp, 0) if slot is not None else 0
            out.ranges.append(("tick:" + tp.topic, lane, offset, offset))
        return out

    def note_forwarded(self, out: Output) -> None:
        """Count a committed batch's forwarded records; name each producer pattern once."""
        for partition, n in out.forwarded.items():
            self.forwarded_from[partition] += n
        for pattern in sorted(set(out.patterns) - self._patterns):
            self._patterns.add(pattern)
            log.warning(
                "records off their run's home partition (%s) are forwarded through %s; "
                "set the producer to key by runId (operationId for channel operations) "
                "with Kafka's Java-compatible murmur2 partitioner, so no hop is needed "
                '(SCALING.md, "Producers and partitioning")',
                pattern, self.topics.repartition,
            )  # fmt: skip

    async def commit(self, commits: Mapping[int, SlotCommit]) -> set[int]:
        """Commit each slot's transaction; the slots found fenced are dropped."""
        fenced = await self.checkpoint.commit({str(p): c for p, c in commits.items()})
        for p, commit in commits.items():
            if str(p) not in fenced and commit.offsets and p in self.held:
                self.held[p].token = self.checkpoint.last.get(str(p), "")
            sent = self._sending.pop(p, None)
            if sent and str(p) not in fenced:  # a fenced commit's copies were never sent
                self.in_flight = self._merged(sent, self.checkpoint.produced)
        for s, why in fenced.items():
            await self.drop(int(s))
            self.fenced_at[int(s)] = Dropped.of(why)
        return {int(s) for s in fenced}

    async def reclaim(self, assigned: set[TopicPartition], after_s: float) -> list[int]:
        """Take back the slots whose fence is due (``Dropped.due``: fenced more than
        ``after_s`` ago, or only lost) that the group still assigns to this process. The
        slots reclaimed."""
        now = time.monotonic()
        due = [p for p, mark in sorted(self.fenced_at.items()) if mark.due(after_s, now)]
        mine = [p for p in due if set(self.tps(p)) <= assigned]
        for p in due:
            del self.fenced_at[p]
        if mine:
            log.warning("slots %s: fenced but still assigned here; taking them back", mine)
            for p in mine:
                await self.transactions.open(str(p))
            await self._restore(mine, await self.consumer.committed(
                [tp for p in mine for tp in self.tps(p)]))  # fmt: skip
        return mine
