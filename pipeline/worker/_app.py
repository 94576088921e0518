"""The faust-streaming worker: Kafka batches -> the shared intake step -> ledger, then topics.

The input topics' records reach the worker a fetch at a time through the bulk intake
(``_bulk``), not through faust's per-message stream path. Per batch, under one lock
shared with the timer and the alerter, these steps run in order, each with its guarantee:

1. **Read back** offsets the consumer skipped (``_offsets``): the batch is gap-free.
2. **Step and store** (``core.store_isolating`` in a thread): parse, dead-letter, run
   semantics per partition, then insert the rows and wait for ClickHouse's
   acknowledgement. Transient insert errors are retried here forever with backoff
   (``LedgerStore``; offsets wait); rows the ledger refuses for good are isolated to
   their records and dead-lettered ``unstorable``. After this step the rows are durable.
3. **Produce** quarantine / runs-closed / alert / DLQ / limit-death records and each
   touched run's state (to the ``run-state`` changelog, partitioned like its lane) with
   the worker's producer (``_produce``), and wait for the broker: all are durable.
4. **Acknowledge** the batch's offsets (``_faust.acknowledge``); faust's committer commits
   them later. A crash before this re-delivers the batch; the core's dedup, the insert
   tokens and the versioned tables make that change no count.

Steps 3-4 of batch N (``_Stored``: its outputs, state bytes and its lanes' event-time
reports as they were when N was stored) run while step 2 of batch N+1 runs in its thread: they touch
neither the core nor the ledger writer. They always finish before batch N+1's, before a
timer tick that ticks one of N's lanes and when no batch is waiting, so records, state
writes and acknowledgements keep the batches' order, and no state or watermark of a
batch not yet in the ledger is ever written.

Rebalances (``_settle``): the run state in memory is valid for one rebalance epoch, the
span between two rebalances. While one is under way nothing is stepped: the consumer's
generation still reads as the old one until the join completes. A batch waits for the
end, then is stepped if it was fetched in the new generation, else dropped (faust sought
back to the committed offsets after its fetch); the timer waits too. The first step of a new epoch
forgets every lane and restores each from its changelog, read back to its end
(``_state``); a batch stepped in an earlier epoch gets no state writes and no
acknowledgement (its records are read again).

Limit deaths and each lane's event-time report go through the single-partition
``<prefix>.limit-deaths`` topic, so one alerter sees every tenant's deaths and decides
them at the pipeline watermark (rule 16); the reports also go to ``<prefix>.lane-marks``,
which every worker reads for one watermark across processes (``_marks``).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import socket
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

import faust
from faust.types import TP

from prism.schemas import AlertRow, ProgressRow

from .._store import LedgerSink, LedgerStore, LedgerUnavailable
from ..core import (
    InRecord,
    Intake,
    LaneReport,
    Output,
    OutRecord,
    PermanentStoreError,
    death_record,
    lane_record,
    store_isolating,
)
from ..settings import Settings
from ._alerter import AlertDesk
from ._bulk import BulkIntake, Chunk
from ._faust import (
    acknowledge,
    committed_offset,
    die,
    highwater,
    in_record,
    lag,
    make_app,
    note_inbound,
    raw_topic,
    rebalance_epoch,
)
from ._gc import GcPolicy
from ._lanes import lane_of, source_of
from ._marks import REPORT_HEARTBEAT_S, LaneMarks
from ._offsets import ReadBack
from ._produce import ProducedRecord, RecordProducer
from ._state import StateReader
from ._telemetry import WorkerTelemetry

__all__ = ["AlertSink", "PipelineWorker"]

log = logging.getLogger("prism.worker")

AlertSink = Callable[[list[AlertRow]], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class _Stored:
    """A batch in the ledger whose records, state and acknowledgement are still to come."""

    out: Output
    offsets: dict[int, tuple[int, int]]  # lane -> first and last offset of the batch
    reports: dict[int, LaneReport]  # each lane's event-time report right after the step
    epoch: int  # the rebalance epoch it was stepped in


_PARSE_AHEAD_SLICE = 128  # values parsed ahead between two pauses
_PARSE_AHEAD_PAUSE = 0.0001  # seconds


@dataclass(frozen=True, slots=True)
class _ParseAhead:
    """The parse of the next batch beside a store: ``start`` once the store has begun,
    ``stop`` once the next step has (it parses what is left)."""

    start: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)


def _record(topic: str, rec: OutRecord, partition: int | None = None) -> ProducedRecord:
    return ProducedRecord(topic, rec.key, rec.value, partition, tuple(rec.headers))


class PipelineWorker:
    """The faust app with its agents, fed into the shared intake step and the ledger.

    ``writer`` is the ledger sink (``sinks.LedgerWriter``); ``alert_sinks`` receive the
    alerts raised (e.g. the webhook notifier); ``clock`` is processing time;
    ``drop_fetched(topic, partition, records)`` true drops a fetched chunk (a test seam,
    ``BulkIntake.drop``).
    """

    def __init__(
        self,
        settings: Settings,
        writer: LedgerSink,
        *,
        alert_sinks: Sequence[AlertSink] = (),
        clock: Callable[[], float] = time.time,
        drop_fetched: Callable[[str, int, list[Any]], bool] | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.alert_sinks = list(alert_sinks)
        self.topics = settings.topics
        self.app: faust.App = make_app(settings)
        # one agent, one consumer group: agent events and channel operations (own lanes)
        self.input = raw_topic(
            self.app, self.topics.input, settings.partitions, self.topics.channel_operations
        )
        self.deaths = raw_topic(self.app, self.topics.limit_deaths, 1)
        # lane state: written by the worker, read back by it (``_state``)
        self._changelog = f"{settings.consumer_group}-run-state-changelog"
        self.state_reader = StateReader(self._changelog, settings.aiokafka_kwargs())
        self._read_state: dict[int, dict[bytes, bytes]] = {}  # partition -> its state, once
        self.producer = RecordProducer(
            settings.aiokafka_kwargs(), max_request_size=settings.max_record_bytes
        )
        self.intake = Intake(settings.core_config(), max_event_bytes=settings.max_event_bytes)
        self.alerts = AlertDesk(settings, self.intake.config, self.producer)  # limit-deaths'
        self.stats: Counter[str] = Counter()
        self._stopping = False
        self.store = LedgerStore(
            writer, give_up_after=None, stopping=lambda: self._stopping, stats=self.stats
        )
        self.read_back = ReadBack(self.topics.input, settings.aiokafka_kwargs())
        self.read_back_channel = ReadBack(
            self.topics.channel_operations, settings.aiokafka_kwargs()
        )
        self.last_offset: dict[int, int] = {}  # lane -> last offset of its last batch
        self._reported: dict[int, tuple[LaneReport, float]] = {}  # lane -> last sent, when
        self.marks = LaneMarks(self.topics.lane_marks, settings.aiokafka_kwargs())
        self._idle_since: dict[int, float] = {}  # lane -> processing time it went idle
        self._loaded: set[int] = set()
        self._epoch: int | None = None  # the rebalance epoch of the lanes in memory
        self._lock = asyncio.Lock()
        self.gc = GcPolicy()
        self._stored: _Stored | None = None  # stored in the ledger, steps 3-4 to come
        self._step_ended: float | None = None  # perf_counter when the last step 2 ended
        self._ahead: _ParseAhead | None = None  # the parse of the batch to be stepped next
        self._ahead_tasks: set[asyncio.Future[None]] = set()
        self.telemetry = WorkerTelemetry(settings.state_dir / "worker-stats.json")
        atexit.register(self.telemetry.write_stats, force=True)
        self._last_log = 0.0
        self._progress_at = 0.0
        self._worker_id = f"{socket.gethostname()}:{os.getpid()}"
        self.bulk = BulkIntake(
            self.app,
            (self.topics.input, self.topics.channel_operations),
            max_pending=max(40_000, 2 * settings.batch_max_events),
            drop=drop_fetched,
        )
        # lane -> (its position, monotonic time) since when its end has been past that
        # position with nothing of it delivered (``_read_undelivered``)
        self._undelivered: dict[int, tuple[int, float]] = {}
        self._in_hand: frozenset[int] = frozenset()  # the lanes of the batch being handled
        self.bulk.install()
        self.app.task(self._bulk_agent)
        self.app.task(self._marks_agent)
        # The agent subscribes the input topics (and co-partitions the tables with them);
        # their records come through the bulk intake, so it sees none once that is installed.
        self.app.agent(self.input, name="prism-events")(cast(Any, self._events_agent))
        # take_events is on the concrete Stream, not on the StreamT protocol faust types with
        self.app.agent(self.deaths, name="prism-limit-deaths")(cast(Any, self._deaths_agent))
        self._tick_interval = max(1.0, settings.batch_max_seconds)
        self.app.timer(interval=self._tick_interval)(self._tick)
        self.app.on_partitions_revoked.connect(cast(Any, self._on_revoked))
        self.app.on_before_shutdown.connect(cast(Any, self._on_shutdown))

    async def _marks_agent(self) -> None:
        """Follow every lane's event-time report (one watermark across processes)."""
        await self.marks.run(lambda: self._stopping)

    def _apply_marks(self, now: float) -> None:
        """Under the lock, before a step or tick: the lanes other processes hold join the
        clock (``_marks``); those this process holds are its own."""
        try:
            assigned = self.app.consumer.assignment()
        except Exception:  # no consumer assignment yet
            assigned = set()
        held = {lane_of(self.topics, tp.topic, tp.partition) for tp in assigned}
        held |= set(self.intake.processors) | set(self.intake.channels)
        self.marks.apply(self.intake.clock, cast(set[int], held), now)

    # -- the input topic ----------------------------------------------------------------
    async def _bulk_agent(self) -> None:
        while not self._stopping:
            if self._stored is not None and not self.bulk.pending:
                try:
                    async with self._lock:  # nothing waiting: finish the stored batch now
                        await self._finish_stored()
                except Exception:  # not cancellation: faust stops tasks by cancelling them
                    die("an unexpected error finishing a stored batch", log)
            chunks = await self.bulk.take(self.settings.batch_max_events)
            if not self._stopping:
                await self.handle_chunks(chunks)

    async def handle_chunks(self, chunks: Sequence[Chunk]) -> None:
        """One batch of the bulk intake (chunks of one consumer generation), under the lock;
        an unexpected error stops the process."""
        batches: dict[int, list[InRecord]] = defaultdict(list)
        for chunk in chunks:
            lane = lane_of(self.topics, chunk.topic, chunk.partition)
            assert lane is not None, chunk.topic
            batches[lane] += map(in_record, chunk.records)
            tp = self._tp(lane)
            note_inbound(self.app, tp, highwater(self.app, tp))
        size = sum(map(len, batches.values()))
        self.telemetry.consumed(size)
        traceparents = [r.traceparent for recs in batches.values() for r in recs]
        self._in_hand = frozenset(batches)  # taken, not stepped yet: not undelivered
        try:
            with self.telemetry.batch_span(size, traceparents):
                while True:
                    async with self._lock:
                        if self._stopping:
                            return  # not stored, not acknowledged: delivered after a restart
                        if chunks[0].generation != self.app.consumer_generation_id:
                            # fetched before a rebalance: they may be another worker's now;
                            # faust sought back to the committed offsets after the fetch,
                            # so whoever holds them now reads them again
                            self.stats["records_dropped_rebalance"] += size
                            log.info("a batch of %d records fetched before a rebalance was "
                                     "dropped (read again by their owner)", size)  # fmt: skip
                            return
                        with self.gc.batch():
                            if await self._handle_batch(batches):
                                return
                    # a rebalance is under way: its end tells whether these are still ours
                    log.info("a batch of %d records waits for the rebalance to end", size)
                    await self._rebalanced()
        except LedgerUnavailable:
            if not self._stopping:
                raise
            return  # stopping while the ledger is down: nothing acknowledged
        except Exception:  # not cancellation: faust stops agents by cancelling them
            die("an unexpected error in the worker's batch step", log)
        finally:
            self._in_hand = frozenset()

    async def _events_agent(self, stream: faust.Stream) -> None:
        """Subscribes the input topics; their records all go through the bulk intake.

        faust acknowledges what its stream yields, so a record reaching this agent would be
        committed without being in the ledger: stop instead (nothing is committed).
        """
        async for _event in stream:
            die("faust delivered an input record past the bulk intake", log)

    async def _handle_batch(self, batches: dict[int, list[InRecord]]) -> bool:
        """Steps 1-2 of a batch (steps 3-4 of the one before beside step 2); False, with
        nothing done, while a rebalance is under way."""
        epoch = self._settle()
        if epoch is None:
            return False
        self.last_offset.update((p, recs[-1].offset) for p, recs in batches.items())
        ack_from: dict[int, int] = {}
        await self._restore_assigned()
        self._apply_marks(self.clock())
        for partition in sorted(batches):
            await self._restore(partition)
            batches[partition], ack_from[partition] = await self._without_gaps(
                partition, batches[partition]
            )
            # a partition with records still waiting holds the pipeline watermark back
            behind = lag(self.app, self._tp(partition), batches[partition][-1].offset)
            self.intake.clock.behind(partition, behind > 0)
            self.telemetry.lag[partition] = behind
        ordered = {p: batches[p] for p in sorted(batches)}
        size = sum(map(len, ordered.values()))
        with self.telemetry.insert_span(size):
            beside: list[Awaitable[object]] = []
            if self._stored is not None:  # the previous batch's steps 3-4 beside this step 2
                beside.append(self._finish_stored())
            previous, ahead = self._ahead, self._start_parse_ahead()
            storing = asyncio.ensure_future(
                asyncio.to_thread(self._step_and_store, ordered, self.clock(), previous, ahead)
            )
            try:
                await asyncio.gather(storing, *beside)
                out = storing.result()
            finally:  # the step stored nothing, or was cancelled: the parse need not wait
                if ahead is not None:
                    ahead.start.set()
        self.telemetry.acknowledged(out.event_ts)
        self.telemetry.counts["parsed_ahead"] = self.intake.ahead_used
        offsets = {p: (ack_from[p], recs[-1].offset) for p, recs in ordered.items()}
        clock = self.intake.clock
        reports = {p: self.intake.lane_report(p, idle=not clock.is_behind(p)) for p in offsets}
        self._stored = _Stored(out, offsets, reports, epoch)
        return True

    async def _rebalanced(self) -> None:
        """Wait until no rebalance is under way (or the worker stops)."""
        while rebalance_epoch(self.app) is None and not self._stopping:
            await asyncio.sleep(0.05)

    def _settle(self) -> int | None:
        """Called under the lock before a step: the rebalance epoch, or None while a
        rebalance is under way (no step then). In a new epoch every lane is forgotten
        first (a rebalance revokes them all); each is restored from its changelog
        when next stepped."""
        epoch = rebalance_epoch(self.app)
        if epoch is not None and epoch != self._epoch:
            held = self._loaded | set(self.intake.processors) | set(self.intake.channels)
            for lane in held | set(self.last_offset):
                self.intake.drop(lane)
            self._loaded.clear()
            self._read_state.clear()
            self.last_offset.clear()
            self._undelivered.clear()  # positions of the old epoch's lanes
            self._epoch = epoch
        return epoch

    def _step_and_store(
        self,
        batches: dict[int, list[InRecord]],
        now: float,
        previous: _ParseAhead | None = None,
        ahead: _ParseAhead | None = None,
    ) -> Output:
        """Step 2 in the step thread, timed for the stage figures (``WorkerTelemetry.stage``):
        the thread's wall and CPU time, and the wall time since the previous step ended.

        ``previous`` is the parse of this batch begun beside the last store: it stops here
        (what it has not parsed, the step parses). ``ahead`` is the parse of the next batch:
        it starts once this step's store begins (``_store_bounded``); ``_handle_batch``
        releases it when the step ends without storing."""
        started, cpu = time.perf_counter(), time.thread_time()
        if previous is not None:
            previous.stop.set()
        begins = ahead.start if ahead is not None else None
        if self._step_ended is not None:
            self.telemetry.stage("between_steps", started - self._step_ended)
        try:
            return store_isolating(
                self.intake, batches, now, lambda out: self._store_bounded(out, begins)
            )
        finally:
            self._step_ended = time.perf_counter()
            self.telemetry.stage("step_thread", self._step_ended - started)
            self.telemetry.stage("step_thread_cpu", time.thread_time() - cpu)

    def _store_bounded(self, out: Output, begins: threading.Event | None = None) -> None:
        """The batch step's store: refuses a step that would leave a state larger than one
        changelog record holds (before any insert), so ``store_isolating`` dead-letters the
        record that makes it so (``unstorable``) and the partition moves on (rule 15);
        otherwise stores as usual, setting ``begins`` as it starts."""
        limit = self.settings.max_state_bytes
        for key, value in out.state_writes.items():
            if value is not None and len(value) > limit:
                name = key.split("\x1f", 2)[-1]
                raise PermanentStoreError(
                    f"the state of {name!r} would be {len(value):,} "
                    f"bytes, more than the {limit:,} a changelog record holds "
                    "(PRISM_MAX_EVENT_BYTES sets it)"
                )
        started = time.perf_counter()
        if begins is not None:  # the next batch's parse may start now
            begins.set()
        try:
            self.store(out)
        finally:
            self.telemetry.stage("store", time.perf_counter() - started)

    def _start_parse_ahead(self) -> _ParseAhead | None:
        """Begin parsing the records queued for the next batch (``Settings.parse_ahead``),
        in a thread of its own that waits for this batch's store to begin; None when off or
        nothing is queued."""
        self._ahead = None
        if not self.settings.parse_ahead:
            return None
        values = [r.value for c in self.bulk.peek(self.settings.batch_max_events)
                  for r in c.records]  # fmt: skip
        if not values:
            return None
        ahead = self._ahead = _ParseAhead()
        task = asyncio.ensure_future(asyncio.to_thread(self._parse_ahead, values, ahead))
        self._ahead_tasks.add(task)
        task.add_done_callback(self._parse_ahead_done)
        return ahead

    def _parse_ahead_done(self, task: asyncio.Future[None]) -> None:
        self._ahead_tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:  # the next step parses all
            log.error("parsing the next batch ahead failed", exc_info=task.exception())

    def _parse_ahead(self, values: list[bytes | None], ahead: _ParseAhead) -> None:
        """The next batch's parse (``Intake.parse_ahead``), from the moment this batch's
        store begins: its INSERTs wait on ClickHouse without the GIL, which the parse then
        has; its core step is done by then, so only the pure parse runs beside the store
        (and a bisection's re-steps, which parse their values themselves). It stops when
        the next step begins, which takes what was parsed and parses the rest."""
        ahead.start.wait()
        if ahead.stop.is_set():
            return
        started = time.perf_counter()
        # In slices, each followed by a short sleep: a sleep blocks, so the store's thread
        # takes the GIL the moment an INSERT returns instead of waiting out a switch
        # interval (a zero sleep lets this thread take the GIL straight back).
        self.intake.parse_ahead(
            values,
            slice_size=_PARSE_AHEAD_SLICE,
            between=lambda: time.sleep(_PARSE_AHEAD_PAUSE),
            stop=ahead.stop.is_set,
        )
        self.telemetry.stage("parse_ahead", time.perf_counter() - started)

    async def _finish_stored(self) -> None:
        """Steps 3-4 of the batch last stored: produce records and state, acknowledge.

        Once a rebalance has begun since the batch was stepped, its lanes get neither
        state writes nor acknowledgements: whoever holds them now reads them again.
        """
        stored, self._stored = self._stored, None
        if stored is None:
            return
        if rebalance_epoch(self.app) != stored.epoch:
            self.stats["batches_unacknowledged_rebalance"] += 1
        await self._publish(stored.out, stored.epoch, stored.reports)
        if rebalance_epoch(self.app) == stored.epoch:  # none began, before or while sending
            for partition, (first, last) in stored.offsets.items():  # faust may commit them
                acknowledge(self.app, self._tp(partition), first, last)
        await self._after(stored.out)

    async def _without_gaps(
        self, partition: int, recs: list[InRecord]
    ) -> tuple[list[InRecord], int]:
        """The batch's records plus any offsets the consumer skipped, read back, in order;
        and the first offset its acknowledgement covers.

        That is the group's committed offset when it is below them: offsets from there to
        the partition's position were processed before (the restored state says so) and
        are in the ledger, but need not be delivered again (a batch fetched as a rebalance
        ended, say). Unacknowledged, they would stop faust's commits for good.
        """
        processed = self.intake.next_offset(partition)
        committed = committed_offset(self.app, self._tp(partition))
        topic, kafka_partition = source_of(self.topics, partition)
        reader = self._reader(topic)
        full, gaps = await reader.fill(kafka_partition, processed, committed, recs)
        first = full[0].offset
        if processed is not None and committed is not None and committed <= processed:
            first = min(first, committed)
        if gaps:
            self.stats["offsets_read_back"] += len(full) - len(recs)
            log.warning(
                "%s[%d]: the consumer skipped %d offset(s) %s (processed up to %s, "
                "committed %s); read back %d record(s)",
                topic,
                kafka_partition,
                sum(end - start for start, end in gaps),
                ", ".join(f"{a}..{b - 1}" for a, b in gaps[:5]),
                processed,
                committed,
                len(full) - len(recs),
            )
        return full, first

    async def _publish(
        self,
        out: Output,
        epoch: int | None = None,
        reports: Mapping[int, LaneReport] | None = None,
    ) -> None:
        """Produce the output records and the run-state writes stepped in rebalance
        ``epoch`` (``_state_records``), and wait until the broker has every one; the
        lanes' event-time ``reports`` follow their deaths to the alerter (rule 16)."""
        t = self.topics
        recs = [_record(t.dlq, r) for r in out.dlq]
        recs += [_record(t.quarantine, r) for r in out.quarantined]
        recs += [_record(t.runs_closed, r) for r in out.closed]
        recs += [_record(t.alerts, r) for r in out.alerts]
        recs += [_record(t.limit_deaths, death_record(d), 0) for d in out.limit_deaths]
        at = self.clock()
        for lane, report in (reports or {}).items():
            if lane in self.intake.processors or lane in self.intake.channels:
                record = lane_record(lane, report, at)
                recs.append(_record(t.limit_deaths, record, 0))
                recs.append(_record(t.lane_marks, record, 0))
                self._reported[lane] = (report, at)
        recs += self._state_records(out.state_writes, epoch)
        await self.producer.send_all(recs)

    def _state_records(
        self, writes: dict[str, bytes | None], epoch: int | None
    ) -> list[ProducedRecord]:
        """Each changed key once, to the changelog partition of its lane; none once a
        rebalance has begun since ``epoch`` (the lanes may be another worker's now)."""
        if epoch is None or rebalance_epoch(self.app) != epoch:
            return []
        recs = []
        for key, value in writes.items():
            lane = int(key.split("\x1f")[1])
            if lane not in self.last_offset:
                continue
            partition = source_of(self.topics, lane)[1]
            recs.append(ProducedRecord(self._changelog, key.encode(), value, partition))
        return recs

    def _reader(self, topic: str) -> ReadBack:
        """The read-back consumer of an input topic."""
        return self.read_back if topic == self.topics.input else self.read_back_channel

    def _tp(self, partition: int) -> TP:
        return TP(*source_of(self.topics, partition))

    async def _restore_assigned(self) -> None:
        """Restore every assigned lane once, also those with nothing new to read: their marks
        belong in the pipeline watermark after a restart (stuck operations, open items' age)."""
        try:
            assigned = list(self.app.consumer.assignment())
        except Exception:  # no consumer assignment yet
            return
        found = (lane_of(self.topics, tp.topic, tp.partition) for tp in assigned)
        lanes = [lane for lane in found if lane is not None and lane not in self._loaded]
        wanted = {source_of(self.topics, lane)[1] for lane in lanes}
        await self._read_states(wanted - set(self._read_state))
        for lane in lanes:
            await self._restore(lane)
        self._read_state.clear()  # every assigned lane has what it needs of it

    async def _read_states(self, partitions: set[int]) -> None:
        """Read these changelog partitions back, all at once, into ``_read_state``."""
        if not partitions:
            return
        self._read_state.update(await self.state_reader.read_many(partitions))
        n, records, seconds = self.state_reader.last_read
        self.stats["state_restores"] += n
        self.telemetry.counts["state_restore_ms_max"] = max(
            self.telemetry.counts["state_restore_ms_max"], int(seconds * 1000)
        )
        log.info(
            "%s%s: read %d state record(s) in %.2fs",
            self._changelog, sorted(partitions), records, seconds,
        )  # fmt: skip

    async def _restore(self, partition: int) -> None:
        """Load a lane's state the first time it is seen in an epoch: its changelog
        partition read back to its end (``_state.StateReader``, once for both lanes of it)."""
        if partition in self._loaded:
            return
        kafka_partition = source_of(self.topics, partition)[1]
        if kafka_partition not in self._read_state:
            await self._read_states({kafka_partition})
        state = self._read_state[kafka_partition]
        lane = str(partition).encode()
        self.intake.load(
            partition,
            ((k.decode(), v) for k, v in state.items() if k.split(b"\x1f")[1:2] == [lane]),
        )
        self._loaded.add(partition)
        done = self.intake.next_offset(partition)
        if done is not None:  # held and processed before: the timer ticks it from now on,
            # so its runs go stale and its grace periods end though no record arrives
            self.last_offset.setdefault(partition, done - 1)
        items = sum(len(p.items) for p in self.intake.lane(partition))
        log.info("lane %d: restored %d runs or channel operations", partition, items)

    async def _after(self, out: Output) -> None:
        self.stats.update(out.stats)
        self.telemetry.outcomes(out.stats)
        if out.ledger.alerts:
            await self._notify(out.ledger.alerts)
        self._log_summary()
        self.telemetry.write_stats()

    # -- time ---------------------------------------------------------------------------
    async def _tick(self) -> None:
        """Grace periods of partitions that went quiet, staleness on the shared watermark."""
        async with self._lock:
            epoch = self._settle()
            if epoch is None:
                return  # nothing is this worker's until the rebalance is over
            now = self.clock()
            # A lane stepped within the interval was ticked by its step, and a lane with
            # records waiting is about to be: only quiet lanes are ticked, so a busy worker's
            # timer does not hold the batch step up. The stored batch finishes first when it
            # holds one of them, so its state writes and records come before the tick's.
            waiting = (lane_of(self.topics, t, p) for t, p in self.bulk.waiting())
            busy = {lane for lane in waiting if lane is not None}
            if await self._read_undelivered(busy):
                return  # a batch was stepped: the next tick ticks
            quiet = self.intake.quiet(now, self._tick_interval, busy)
            stored = self._stored.offsets if self._stored is not None else {}
            if set(stored) & set(quiet):
                await self._finish_stored()
            if self.gc.maybe_collect():
                log.debug(
                    "full GC pass %d: %.3fs, %d unreachable objects found so far",
                    self.gc.full_passes, self.gc.last_pause, self.gc.collected,
                )  # fmt: skip
            await self._restore_assigned()
            self._apply_marks(now)
            lanes = set(self.intake.processors) | set(self.intake.channels)
            live = [p for p in sorted(lanes) if p in self.last_offset]
            if not live:
                reports = self._lane_reports(now)
                if reports:
                    await self._publish(Output(), epoch, reports)
                return
            for p in live:  # caught up since its last batch? then it holds nothing back
                done = self.intake.next_offset(p) or 0
                self.intake.clock.behind(p, lag(self.app, self._tp(p), done - 1) > 0)
            outs = self.intake.tick(now, self._tick_interval, busy)
            out = Output()
            for partition, part in outs.items():
                out.extend(part)
                offset = self.last_offset.get(partition, 0)
                out.ranges.append(("tick:" + self.topics.input, partition, offset, offset))
            out.ledger.progress.extend(self._progress(live))
            ledger = out.ledger
            changed = ledger.runs or ledger.alerts or ledger.progress or out.closed
            reports = self._lane_reports(now)  # after the tick: the runs it closed are gone
            if not (changed or ledger.channel_operations or ledger.channel_watermarks):
                self.intake.commit(outs)
                await self._publish(out, epoch, reports)
                return
            try:
                await asyncio.to_thread(self.store, out)
            except PermanentStoreError:
                self.intake.rollback(outs)
                log.exception("the ledger refused rows of the timer; they are retried next tick")
                return
            self.intake.commit(outs)
            await self._publish(out, epoch, reports)
            await self._after(out)

    def _lane_reports(self, now: float) -> dict[int, LaneReport]:
        """The event-time report of each assigned lane that changed since it was last sent:
        idle once its position reached the partition's end, quiet
        once idle for the allowed lateness in processing time (rule 16)."""
        try:
            assigned = list(self.app.consumer.assignment())
        except Exception:  # no consumer assignment yet
            return {}
        lanes = {lane_of(self.topics, tp.topic, tp.partition) for tp in assigned} - {None}
        for lane in set(self._reported) - lanes:  # revoked: its new owner reports it
            self._reported.pop(lane, None)
            self._idle_since.pop(lane, None)
        lateness = self.intake.config.lateness_s
        changed: dict[int, LaneReport] = {}
        for lane in sorted(cast(set[int], lanes)):
            end = highwater(self.app, self._tp(lane))
            idle = end is not None and end <= (self.intake.next_offset(lane) or 0)
            since = now
            if idle:
                since = self._idle_since.setdefault(lane, now)
            else:
                self._idle_since.pop(lane, None)
            quiet = idle and now - since >= lateness
            report = self.intake.lane_report(lane, idle=idle, quiet=quiet)
            last, at = self._reported.get(lane, (None, 0.0))
            if last != report or now - at >= REPORT_HEARTBEAT_S:  # unchanged ones expire
                changed[lane] = report
        return changed

    async def _read_undelivered(self, busy: set[int]) -> bool:
        """Read back and step the records of assigned lanes that the consumer no longer
        delivers; True if a batch was stepped (called by the timer, under the lock).

        The batch read-back (``_without_gaps``) fills what the consumer skipped once later
        records of the partition arrive. When none do, records fetched and dropped around a
        rebalance (``BulkIntake``: after faust's seek, before its flow resumed) would wait
        for good and the group's commit with them. So a lane whose end has stayed past its
        position, with nothing of it queued or stepped, for
        ``Settings.undelivered_read_back_seconds`` gets up to a batch read back from its
        position. Should the consumer deliver them after all, they are re-deliveries,
        which change nothing.
        """
        wait = self.settings.undelivered_read_back_seconds
        if not wait or self._stopping:
            return False
        try:
            assigned = list(self.app.consumer.assignment())
        except Exception:  # no consumer assignment yet
            return False
        stored = self._stored.offsets if self._stored is not None else {}
        skip = busy | self._in_hand | set(stored)
        behind: dict[int, tuple[int, int]] = {}  # lane -> (position, end)
        for tp in assigned:
            lane = lane_of(self.topics, tp.topic, tp.partition)
            end = highwater(self.app, tp)
            if lane is None or end is None or end == 0 or lane in skip:
                continue
            await self._restore(lane)  # its position is in its state
            try:
                position = await self._reader(tp.topic).expected(
                    tp.partition, self.intake.next_offset(lane), committed_offset(self.app, tp)
                )
            except Exception:  # the broker is away: the next tick asks again
                continue
            if position < end:
                behind[lane] = (position, end)
        now = time.monotonic()
        since = self._undelivered
        self._undelivered = {
            lane: since[lane] if lane in since and since[lane][0] == pos else (pos, now)
            for lane, (pos, _) in behind.items()
        }
        due = {
            lane: span for lane, span in behind.items() if now - self._undelivered[lane][1] >= wait
        }
        if not due:
            return False
        batches: dict[int, list[InRecord]] = {}
        for lane, (position, end) in sorted(due.items()):
            topic, kafka_partition = source_of(self.topics, lane)
            reader = self._reader(topic)
            stop = min(end, position + self.settings.batch_max_events)
            try:
                recs = await reader.read(kafka_partition, [(position, stop)])
            except Exception:  # the broker is away: the next tick tries again
                log.warning("%s[%d]: reading back undelivered offsets %d..%d failed",
                            topic, kafka_partition, position, stop - 1, exc_info=True)  # fmt: skip
                continue
            log.warning(
                "%s[%d]: offsets %d..%d were not delivered in %.0fs; read back %d record(s)",
                topic, kafka_partition, position, end - 1, now - self._undelivered[lane][1],
                len(recs),
            )  # fmt: skip
            self.stats["offsets_read_undelivered"] += len(recs)
            if recs:
                batches[lane] = recs
        if not batches:
            return False
        self._undelivered.clear()
        with self.gc.batch():
            return await self._handle_batch(batches)

    def _progress(self, partitions: list[int]) -> list[ProgressRow]:
        """Each held partition's position, once per ``progress_interval_seconds``."""
        interval = self.settings.progress_interval_seconds
        now = self.clock()
        if not interval or now - self._progress_at < interval:
            return []
        self._progress_at = now
        last = self.telemetry.last_batch_at
        rows = []
        for p in partitions:
            end = highwater(self.app, self._tp(p))
            if end is None:
                continue
            processed = self.intake.next_offset(p) or 0
            topic, kafka_partition = source_of(self.topics, p)
            rows.append(ProgressRow(
                datetime.fromtimestamp(now, UTC), self._worker_id, topic, kafka_partition,
                processed, end, max(0, end - processed),
                datetime.fromtimestamp(last, UTC) if last else None,
            ))  # fmt: skip
        return rows

    # -- the alerter --------------------------------------------------------------------
    async def _deaths_agent(self, stream: faust.Stream) -> None:
        async for events in stream.take_events(1000, 0.5):
            async with self._lock:
                await self._alert_batch(events)

    async def _alert_batch(self, events: Sequence[Any]) -> None:
        epoch = rebalance_epoch(self.app)
        first, last = events[0].message.offset, events[-1].message.offset
        out = await self.alerts.step([e.message.value for e in events], first, last)
        self.stats.update(out.stats)
        if out.ledger.alerts:
            await asyncio.to_thread(self.store, out)
            await self._publish(out)
            await self._notify(out.ledger.alerts)
        # the partition may be another worker's now: then the state is not written here
        held = epoch is not None and rebalance_epoch(self.app) == epoch and self._holds_deaths()
        await self.alerts.save(still_held=held)

    def _holds_deaths(self) -> bool:
        try:
            return TP(self.topics.limit_deaths, 0) in self.app.consumer.assignment()
        except Exception:  # no consumer assignment yet
            return False

    async def _notify(self, rows: list[AlertRow]) -> None:
        for sink in self.alert_sinks:
            try:
                await sink(rows)
            except Exception:  # a notifier must never stop the stream
                log.exception("alert sink %r failed", sink)

    # -- lifecycle ----------------------------------------------------------------------
    async def _on_shutdown(self, app: Any, **_: Any) -> None:
        """The consumer has stopped: finish the stored batch (faust's last commit takes its
        offsets), let notifiers deliver what they queued, write stats."""
        self._stopping = True
        if self._ahead is not None:  # no step follows: the parse ends now
            self._ahead.stop.set()
            self._ahead.start.set()
        try:
            async with asyncio.timeout(30.0), self._lock:  # a batch in flight ends first
                await self._finish_stored()
        except Exception:  # not finished: its records are read again after a restart
            log.warning("the last stored batch was not finished at shutdown", exc_info=True)
        for sink in self.alert_sinks:
            aclose = getattr(sink, "aclose", None)
            if aclose is not None:
                try:
                    await aclose(timeout=5.0)
                except Exception:
                    log.exception("closing alert sink %r failed", sink)
        self.telemetry.stopped()  # stats file + the summary line
        await self.read_back.close()
        await self.marks.close()
        await self.state_reader.close()
        await self.alerts.close()
        await self.producer.close()
        await self.read_back_channel.close()

    async def _on_revoked(self, app: Any, revoked: set[Any], **_: Any) -> None:
        # Never wait for the lock here: a batch holding it may be waiting on the producer
        # or the consumer, which wait for this handler. The queued chunks go now; the lanes
        # at the first step after the rebalance (``_settle``: their state is in their
        # changelog, and a lane assigned back is read back from it).
        self.bulk.forget((tp.topic, tp.partition) for tp in revoked)

    def _log_summary(self) -> None:
        now = time.monotonic()
        if now - self._last_log >= 30:
            self._last_log = now
            bad = {k: v for k, v in self.stats.items() if k.startswith(("dlq.", "quarantine."))}
            log.info(
                "applied=%d duplicates=%d closed=%d rejected=%s",
                self.stats["applied"],
                self.stats["duplicate"],
                self.stats["closed"],
                bad or "none",
            )
