"""What a worker learns from its partitions' positions and ends, between batches.

``PartitionWatch`` compares each held partition's position (the next offset the worker
will step, ``_slots.Slot.positions``) with the consumer's position and the partition's
end offset, and turns that into:

- **the records of a fetch to step** (``route``): by lane, those of held slots from
  each partition's position on, and with them whether each lane has more waiting
  (``behind``: its grace period) and the input's lag per partition (``lag``);
- **read-backs** of offsets the consumer handed out that were never stepped: at the start
  of a fetch (``fill``) or, when no later record shows the gap, after the consumer's
  position has stayed past the worker's for ``Settings.undelivered_read_back_seconds``
  (``undelivered``). Input topics only: their offsets are all records;
- **positions moved past transaction markers** on the repartition topics
  (``past_markers``): every record handed out is stepped, so a consumer position further
  on means markers or aborted copies in between;
- **lane reports** for the alerter and the shared watermark (``reports``, rule 16): idle
  once every partition of the lane is at its end, quiet once idle for the allowed lateness
  in processing time; a report is sent when it changes or every ``_marks.heartbeat_s``;
- **progress rows** (``progress``): each held input partition's position and end, once per
  ``Settings.progress_interval_seconds``, for the Pipeline dashboard's lag panel;
- **holds released** (``release_copies``): a step that forwards copies holds the
  watermark at their time on their home lane (``Intake.hold``), and the commit keeps
  them as copies in flight (``Slots.in_flight``, written into every slot's position
  record, so the next owner of a slot of a process that died holds them in its place).
  A hold is released once the home lane's repartition position is past the last copy
  in flight there: this process's own position when it holds the home lane (or nothing
  waits there), else the position in that lane's last report (lane-marks).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from aiokafka import TopicPartition

from prism.schemas import ProgressRow

from ..core import InRecord, Intake, LaneReport, lane_of_forwarded
from ..settings import Settings
from ._consumer import GroupConsumer
from ._marks import heartbeat_s
from ._offsets import ReadBack
from ._slots import Slots, slot_of

__all__ = ["PartitionWatch"]

log = logging.getLogger("prism.worker")


class PartitionWatch:
    """See the module docstring; ``stats`` counts the offsets read back, ``lag`` is the
    input's lag by partition (the worker's telemetry)."""

    def __init__(
        self,
        settings: Settings,
        slots: Slots,
        consumer: GroupConsumer,
        intake: Intake,
        stats: Counter[str],
        worker_id: str,
        lag: dict[int, int],
    ) -> None:
        self.settings = settings
        self.topics = settings.topics
        self.slots = slots
        self.consumer = consumer
        self.intake = intake
        self.stats = stats
        self.worker_id = worker_id
        self.lag = lag
        kw = settings.aiokafka_kwargs()
        self.readers = {topic: ReadBack(topic, kw) for topic in self.topics.slot_topics}
        # lane -> the report last sent, its repartition position then, and when
        self._reported: dict[int, tuple[LaneReport, int | None, float]] = {}
        self.repeats: set[int] = set()  # lanes of the last ``reports`` sent again unchanged
        self._idle_since: dict[int, float] = {}  # lane -> processing time it went idle
        self._undelivered: dict[TopicPartition, tuple[tuple[int, int], float]] = {}
        self._progress_at = 0.0

    # -- a fetch ------------------------------------------------------------------------
    async def route(
        self,
        fetched: Mapping[TopicPartition, list[InRecord]],
        drop: Callable[[str, int, list[Any]], bool] | None = None,
    ) -> tuple[dict[bool, dict[int, list[InRecord]]], dict[TopicPartition, int]]:
        """The records of ``fetched`` to step, by kind (True: repartition copies) and lane,
        and each partition's next position after them. Left out: partitions of slots not
        held (any more: their owner reads them), records below the position (re-deliveries)
        and chunks ``drop`` says to drop (a test seam: input topics only, read back later).
        A chunk that begins past the position is completed by reading the gap back."""
        steps: dict[bool, dict[int, list[InRecord]]] = {False: {}, True: {}}
        after: dict[TopicPartition, int] = {}
        for tp, recs in sorted(fetched.items()):
            slot = self.slots.held.get(tp.partition)
            lane = self.slots.lane_of(tp)
            if slot is None or lane is None:
                continue
            forwarded = self.slots.forwarded(tp)
            if not forwarded and drop is not None and drop(tp.topic, tp.partition, recs):
                continue
            pos = slot.positions.get(tp)
            ins = [r for r in recs if pos is None or r.offset >= pos]
            if not ins:
                continue
            if pos is not None and ins[0].offset > pos and not forwarded:  # markers there
                ins = await self.fill(tp, pos, ins[0].offset) + ins
            steps[forwarded].setdefault(lane, []).extend(ins)
            after[tp] = ins[-1].offset + 1
            self.behind(tp, lane, self.consumer.highwater(tp), after[tp])
        return steps, after

    def behind(self, tp: TopicPartition, lane: int, end: int | None, position: int) -> None:
        """Whether ``lane`` has records past ``position`` (``end``: the partition's end,
        None unknown), for its grace period; the input's lag, per partition."""
        waiting = end is not None and end > position
        self.intake.behind(lane, waiting, forwarded=self.slots.forwarded(tp))
        if tp.topic == self.topics.input:
            self.lag[tp.partition] = max(0, (end or 0) - position)

    def at_ends(self, ends: Mapping[TopicPartition, int]) -> None:
        """``behind`` for every held partition, from its end offset in ``ends``."""
        for p, slot in self.slots.held.items():
            for tp in self.slots.tps(p):
                lane = self.slots.lane_of(tp)
                if lane is not None:
                    self.behind(tp, lane, ends.get(tp, 0), slot.positions.get(tp, 0))

    # -- read-backs -----------------------------------------------------------------------
    async def fill(self, tp: TopicPartition, start: int, end: int) -> list[InRecord]:
        """Offsets ``start..end-1`` of ``tp``, read back: handed out and never stepped."""
        recs = await self.readers[tp.topic].read(tp.partition, [(start, end)])
        self.stats["offsets_read_back"] += len(recs)
        log.warning("%s[%d]: the consumer skipped offsets %d..%d; read back %d record(s)",
                    tp.topic, tp.partition, start, end - 1, len(recs))  # fmt: skip
        return recs

    async def undelivered(
        self, consumed: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, list[InRecord]]:
        """The records of held input partitions whose consumer position (``consumed``, as
        ``GroupConsumer.positions`` gave them) has stayed past the worker's for
        ``Settings.undelivered_read_back_seconds``, read back."""
        wait = self.settings.undelivered_read_back_seconds
        if not wait:
            return {}
        now, behind = time.monotonic(), {}
        for p, slot in self.slots.held.items():
            for tp in self.slots.tps(p):
                if self.slots.forwarded(tp):
                    continue  # gaps there are transaction markers (``past_markers``)
                pos = slot.positions.get(tp)
                fetched = consumed.get(tp)
                if pos is not None and fetched is not None and fetched > pos:
                    behind[tp] = (pos, fetched)
        seen = self._undelivered  # tp -> (its gap, since when it has been there)
        self._undelivered = {tp: seen[tp] if tp in seen and seen[tp][0] == span else (span, now)
                             for tp, span in behind.items()}  # fmt: skip
        due = {tp: span for tp, span in behind.items() if now - self._undelivered[tp][1] >= wait}
        records: dict[TopicPartition, list[InRecord]] = {}
        for tp, (pos, end) in sorted(due.items()):
            recs = await self.readers[tp.topic].read(tp.partition, [(pos, end)])
            log.warning("%s[%d]: offsets %d..%d were not delivered in %.0fs; read back %d "
                        "record(s)", tp.topic, tp.partition, pos, end - 1,
                        now - self._undelivered[tp][1], len(recs))  # fmt: skip
            self.stats["offsets_read_undelivered"] += len(recs)
            records[tp] = recs
        if records:
            self._undelivered.clear()
        return records

    def past_markers(self, consumed: Mapping[TopicPartition, int]) -> set[int]:
        """Move each held repartition partition's position to the consumer's (``consumed``)
        when that is further (see the module docstring); the slots whose positions moved."""
        moved = set()
        for p, slot in self.slots.held.items():
            for tp in self.slots.tps(p):
                if not self.slots.forwarded(tp):
                    continue
                fetched = consumed.get(tp)
                if fetched is not None and fetched > slot.positions.get(tp, 0):
                    slot.positions[tp] = fetched
                    moved.add(p)
        return moved

    # -- reports --------------------------------------------------------------------------
    def reports(
        self, now: float, ends: Mapping[TopicPartition, int] | None
    ) -> dict[int, LaneReport]:
        """The event-time report of each held lane that changed since it was last sent
        (or is due again): idle once its partitions' positions reached their ends (from
        a real offsets request, ``ends``; without one, as the last fetch saw them), quiet
        once idle for the allowed lateness in processing time (rule 16)."""
        lateness = self.intake.config.lateness_s
        heartbeat = heartbeat_s(self.settings.consumer_session_timeout_seconds)
        sent = self.intake.sent_hold()  # copies on their way, wherever their home is
        changed: dict[int, LaneReport] = {}
        self.repeats = set()
        for p, slot in sorted(self.slots.held.items()):
            for lane in slot.lanes:
                if not self.intake.lane(lane):
                    continue
                idle = True
                for tp in self.slots.tps(p):
                    if self.slots.lane_of(tp) != lane:
                        continue
                    end = ends.get(tp) if ends is not None else self.consumer.highwater(tp)
                    idle = idle and end is not None and end <= slot.positions.get(tp, 0)
                since = self._idle_since.setdefault(lane, now) if idle else now
                if not idle:
                    self._idle_since.pop(lane, None)
                quiet = idle and now - since >= lateness
                report = self.intake.lane_report(lane, idle=idle, quiet=quiet, hold_us=sent)
                copies = slot.positions.get(TopicPartition(self.slots.repartition_of(lane), p))
                last, last_copies, at = self._reported.get(lane, (None, None, 0.0))
                if (last, last_copies) != (report, copies):
                    changed[lane] = report
                elif now - at >= heartbeat:  # unchanged: for lane-marks' readers only
                    changed[lane] = report
                    self.repeats.add(lane)
        return changed

    def sent(self, reports: Mapping[int, LaneReport], now: float, fenced: set[int]) -> None:
        """``reports`` were committed at ``now``, but those of the ``fenced`` slots."""
        for lane, report in reports.items():
            p = slot_of(lane)
            if p not in fenced and p in self.slots.held:
                tp = TopicPartition(self.slots.repartition_of(lane), p)
                self._reported[lane] = (report, self.slots.held[p].positions.get(tp), now)

    def progress(
        self, now: float, ends: Mapping[TopicPartition, int], last_batch_at: float | None
    ) -> list[ProgressRow]:
        """Each held input partition's position, once per ``progress_interval_seconds``."""
        interval = self.settings.progress_interval_seconds
        if not interval or now - self._progress_at < interval:
            return []
        self._progress_at = now
        rows = []
        for p, slot in sorted(self.slots.held.items()):
            for topic in (self.topics.input, self.topics.channel_operations):
                tp = TopicPartition(topic, p)
                if tp not in ends:
                    continue
                done = slot.positions.get(tp, 0)
                rows.append(ProgressRow(
                    datetime.fromtimestamp(now, UTC), self.worker_id, topic, p, done,
                    ends[tp], max(0, ends[tp] - done),
                    datetime.fromtimestamp(last_batch_at, UTC) if last_batch_at else None,
                ))  # fmt: skip
        return rows

    # -- forwarded copies ------------------------------------------------------------------
    def release_copies(self, reported: Mapping[int, int]) -> None:
        """Release the holds of home lanes whose repartition position is past the last
        copy in flight there (``Slots.in_flight``): this process's own position when it
        holds the home lane, else the one its owner last reported (``reported``: lane ->
        position, from lane-marks). A hold with no copy in flight (its commit was fenced:
        the slot's next owner sends them again) waits for the last copy this process
        produced there. The holds of a home held here are also released by this
        process's tick once nothing waits there (``Intake.behind``)."""
        in_flight, produced = self.slots.in_flight, self.slots.checkpoint.produced
        homes = set(in_flight)
        homes.update(lane for key in self.intake.clock.holds()
                     if (lane := lane_of_forwarded(key)) is not None)  # fmt: skip
        for lane in sorted(homes):
            p, topic = slot_of(lane), self.slots.repartition_of(lane)
            last = in_flight[lane][1] if lane in in_flight else produced.get((topic, p), -1)
            slot = self.slots.held.get(p)
            position = (
                slot.positions.get(TopicPartition(topic, p)) if slot is not None
                else reported.get(lane)
            )  # fmt: skip
            if position is not None and position > last:
                in_flight.pop(lane, None)
                self.intake.hold(lane, None)

    async def close(self) -> None:
        for reader in self.readers.values():
            await reader.close()
