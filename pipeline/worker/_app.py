"""The worker: Kafka batches -> the shared intake step -> ledger -> one transaction per slot.

Wiring only; each part is a module of its own:

- ``_consumer``: the one boundary to the consumer group (``GroupConsumer``: fetch, seek,
  end offsets, assignment callbacks), on aiokafka with the slot assignor, read committed;
- ``_slots``: the slots this process holds (partition ``p`` of the input, channel and
  repartition topics), their restore on assignment and their share of each commit;
- ``_checkpoint``: the commit sequence (ledger, then one Kafka transaction per slot with
  its outputs, state and offsets) and what a crash between two steps leaves;
- ``_step``: step 1 in the step thread: ``core.Intake`` through ``core.store_isolating``
  (parse, run semantics, poison isolation), then the ledger's acknowledgement;
- ``_alerter``: the one exhaustion alerter on the single ``limit-deaths`` partition,
  while this process holds it (its take-over, batches, commits and give-up);
- ``_marks``: every lane's event-time report, for one watermark across processes;
- ``_watch``: positions against ends: which fetched records to step, read-backs, lane
  reports, progress rows;
- ``_notify``: the alert sinks a committed batch's alerts go to;
- ``_pace``: how many records a fetch may take (a take-over waits for the batch in hand).

One task runs the loop: take over an assignment (``take_over``), fetch, then under the
lock a batch (``_batch``) and the due tick (``_tick``), each stepped in a thread. ``revoked``
does not wait for a batch in hand: the member rejoins at once, and the batch commits as
if nothing had happened. If a slot of it moved, the new owner's producer fences the
transaction, or the new owner reads it back whole (``_checkpoint``: the zombie's case);
the revoked slots are parked when the batch is done (``_settle``). A held partition's
position is the next offset to step: records below it are re-deliveries, a fetch that
begins past it is completed by reading the offsets between back (``_watch``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from aiokafka import TopicPartition

from .._store import LedgerSink, LedgerStore, LedgerUnavailable
from ..core import InRecord, Intake, Output, PermanentStoreError
from ..settings import Settings
from ._alerter import AlertDesk
from ._budget_desk import LaneSpend
from ._checkpoint import Checkpoint, Transactions, quiet_fenced_futures
from ._consumer import Fetched, GroupConsumer, KafkaGroupConsumer
from ._gc import GcPolicy
from ._lanes import CHANNEL_LANE
from ._loopwatch import Laps, LoopWatch
from ._marks import LaneMarks
from ._notify import AlertSink, Notifiers
from ._pace import BatchPace
from ._records import die
from ._slots import Slots, slot_of
from ._state import StateReader
from ._step import StepThread
from ._telemetry import WorkerTelemetry
from ._watch import PartitionWatch

__all__ = ["AlertSink", "PipelineWorker"]

log = logging.getLogger("prism.worker")

_MARKS_WAIT_S = 60  # the longest a starting worker waits to read the other lanes' reports
_REFETCH_S = 0.05  # a fetch that took all records in hand waits this long for newer ones


class PipelineWorker:
    """One worker process of the group (see the module docstring). ``writer``: the ledger
    sink; ``alert_sinks``: where alerts go (e.g. the webhook); ``clock``: processing time;
    ``consumer`` and ``transactions`` replace the group consumer and transactional producers
    (tests); ``drop_fetched(topic, partition, records)`` true drops a fetched chunk before
    its step (a test seam: ``_watch`` reads it back); ``prices``: the budget desk's book.
    """

    def __init__(
        self,
        settings: Settings,
        writer: LedgerSink,
        *,
        alert_sinks: Sequence[AlertSink] = (),
        clock: Callable[[], float] = time.time,
        consumer: GroupConsumer | None = None,
        transactions: Transactions | None = None,
        drop_fetched: Callable[[str, int, list[Any]], bool] | None = None,
        prices: Callable[[], Iterable[Any]] | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.notifiers = Notifiers(alert_sinks)
        self.topics = t = settings.topics
        self.drop_fetched = drop_fetched
        kw, group = settings.aiokafka_kwargs(), settings.consumer_group
        self.intake = Intake(
            settings.core_config(),
            max_event_bytes=settings.max_event_bytes,
            route_partitions=settings.partitions,  # every run judged on its home lane
            channel_lane=CHANNEL_LANE,
        )
        self.stats: Counter[str] = Counter()
        self._stopping = False
        self.store = LedgerStore(
            writer, give_up_after=None, stopping=lambda: self._stopping, stats=self.stats
        )
        self.consumer: GroupConsumer = consumer or KafkaGroupConsumer.of(settings, group, kw)
        self._worker_id = f"{socket.gethostname()}:{os.getpid()}"
        self.transactions = transactions or Transactions.of(settings, group, kw)
        self.checkpoint = Checkpoint(self.transactions, f"{self._worker_id}:{uuid.uuid4().hex[:8]}")
        changelog = f"{group}-run-state-changelog"
        self.slots = Slots(
            t, settings.partitions, changelog, self.intake, self.consumer,
            StateReader(changelog, kw), self.transactions, self.checkpoint,
        )  # fmt: skip
        self.telemetry = WorkerTelemetry(settings.state_dir / "worker-stats.json")
        self.step_thread = StepThread(
            self.intake, self.store, self.telemetry, settings.max_state_bytes, clock
        )
        self.watch = PartitionWatch(settings, self.slots, self.consumer, self.intake,
                                    self.stats, self._worker_id, self.telemetry.lag)  # fmt: skip
        self.alerts = AlertDesk(settings, self.intake.config)
        if settings.budgets_file is not None:  # every lane's billed spend to the budget desk
            self.slots.spend = LaneSpend(prices)
        self._assigned: set[TopicPartition] | None = None  # to take over (``take_over``)
        self.marks = LaneMarks(
            t.lane_marks, kw, idle_expiry_s=settings.consumer_session_timeout_seconds
        )
        self._lock = asyncio.Lock()
        self._stepping = False  # a batch or tick in hand: a revocation is settled after it
        self._revoking: set[TopicPartition] = set()  # revoked, not settled yet
        self.gc = GcPolicy()
        self._tick_interval = max(1.0, settings.batch_max_seconds)
        self.rebalances, session_s = 0, settings.consumer_session_timeout_seconds
        self.pace = BatchPace(settings.batch_max_events, target_s=session_s / 4)
        self.laps = Laps()  # where the batch or tick in hand spends its time
        self.loop_watch = LoopWatch(warn_s=max(1.0, session_s / 4))  # heartbeats wait on it

    async def run(self) -> None:
        """Join the group and work until ``stop``; a failure stops the process uncommitted."""
        quiet_fenced_futures(asyncio.get_running_loop())
        await self.consumer.start([*self.topics.slot_topics, self.topics.limit_deaths], self)
        marks = asyncio.ensure_future(self.marks.run(lambda: self._stopping))
        self.loop_watch.start()
        if not await self.marks.wait_caught_up(_MARKS_WAIT_S):  # the lanes that hold time
            log.warning("the lane reports were not read within %ds; going on", _MARKS_WAIT_S)
        next_tick = time.monotonic() + self._tick_interval
        try:
            while not self._stopping:
                await self.take_over()
                wait = min(self._tick_interval, max(0.05, next_tick - time.monotonic()))
                started = time.monotonic()
                fetched = await self.consumer.fetch(self.pace.limit(), wait, _REFETCH_S)
                self.telemetry.stage("fetch", time.monotonic() - started)
                next_tick = await self._work(fetched, next_tick)
        except LedgerUnavailable:
            if not self._stopping:
                raise
        except Exception:
            die("an unexpected error in the worker's loop", log)
        finally:
            await self._shutdown(marks)

    async def _work(self, fetched: Fetched, next_tick: float) -> float:
        """Under the lock: the batch in hand, then the tick if due (``next_tick``, the
        monotonic time it is due at); a revocation meanwhile is settled after the batch
        (``revoked``). The time the next tick is due."""
        async with self._lock:
            if self._stopping:
                return next_tick
            self._stepping = True
            try:
                if len(fetched):
                    started, self.laps = time.monotonic(), Laps()
                    with self.gc.batch():
                        await self._batch(fetched.records)
                    took = time.monotonic() - started
                    self.telemetry.laps("batch", self.laps.parts)
                    self.pace.took(len(fetched), took)
                    self._slow(f"a batch of {len(fetched):,} records", took)
                await self._settle()  # the tick leaves revoked slots alone
                started = time.monotonic()
                if started >= next_tick:
                    self.laps = Laps()
                    with self.gc.batch():  # a tick decodes runs too (20 of 27 s were GC once)
                        await self._tick()
                    ended = time.monotonic()
                    self.telemetry.laps("tick", self.laps.parts)
                    next_tick = ended + self._tick_interval
                    self._slow("the timer's tick", ended - started)
            finally:
                self._stepping = False
        return next_tick

    def _slow(self, what: str, seconds: float) -> None:
        """Log ``what`` when it held the batch lock past twice the pace's target: a slot
        assigned meanwhile waits for it (in a soak, a restarted worker's first tick held
        its restored slots 10.6 s)."""
        if seconds > 2 * self.pace.target_s:
            held = sorted(self.slots.held)
            log.warning("%s took %.1fs (slots held %s): %s", what, seconds, held, self.laps)

    def stop(self) -> None:  # SIGTERM, SIGINT: after the batch in hand
        self._stopping = True

    async def revoked(self, tps: set[TopicPartition]) -> None:
        """The group takes ``tps`` back. A batch or tick in hand is not waited for: every
        member's rejoin waits on this callback, and a batch slowed by a broker restart
        held the whole group still for 15 s in a soak. The batch commits as a zombie's
        would (a moved slot's new owner fences it, or reads it back whole) and the slots
        are parked after it; otherwise (a take-over in hand) this waits for the lock."""
        self.rebalances += 1
        self._assigned = None  # an assignment not taken over yet is void
        self._revoking |= set(tps)
        if self._stepping:
            return
        async with self._lock:
            await self._settle()

    async def _settle(self) -> None:
        """Park the revoked slots and give up the alerter if it was revoked (under the lock)."""
        tps, self._revoking = self._revoking, set()
        if not tps:
            return
        self.slots.revoked(tps)
        if self.alerts.tp in tps:
            await self.alerts.give_up(self.transactions)

    async def assigned(self, tps: set[TopicPartition]) -> None:
        """Only note ``tps``, paused: aiokafka sends no heartbeat until this returns, and a
        restore can outlast the session timeout (the member was dropped and the group
        rebalanced again, over and over, under load). The loop takes them over."""
        self.consumer.pause(tps)
        self._assigned = set(tps)

    async def take_over(self) -> None:  # the slots and the alerter of the last assignment
        async with self._lock:
            await self._settle()  # revocations that came during the last batch
            tps, self._assigned = self._assigned, None
            if self._stopping:
                return  # leaving the group: the next owners take these over
            if tps is None:  # a reclaim opens producers, so a revocation waits for it here
                session_s = self.settings.consumer_session_timeout_seconds
                await self.slots.reclaim(self.consumer.assignment(), 2 * session_s)
                await self.alerts.reclaim(self.consumer, self.transactions, 2 * session_s)
                return
            self.alerts.fenced_at = None  # whatever was fenced, the group has spoken since
            try:
                await self.slots.assigned(tps)
                if self.alerts.tp in tps:
                    await self.alerts.take(self.consumer, self.transactions)
            except Exception:
                die("taking over the assigned partitions failed", log)
            self.consumer.resume(tps)
            self._report_figures()
            held, alerter = sorted(self.slots.held), " and the alerter" * self.alerts.held
            log.info("assigned slots %s%s", held, alerter)

    async def _batch(self, fetched: dict[TopicPartition, list[InRecord]]) -> None:
        deaths = fetched.pop(self.alerts.tp, [])
        steps, after = await self.watch.route(fetched, self.drop_fetched)
        self.laps.lap("routing and reading back")
        if not after:
            await self._alert_batch(deaths)
            self.laps.lap("the alerter's batch")
            return
        size = sum(len(r) for s in steps.values() for r in s.values())
        self.telemetry.consumed(size)
        self.marks.apply(self.intake.clock, self.slots.lanes(), self.clock())
        parts: dict[int, Output] = {}
        out = Output()
        traceparents = [r.traceparent for s in steps.values() for rs in s.values() for r in rs]
        with self.telemetry.batch_span(size, traceparents), self.telemetry.insert_span(size):
            for forwarded, batches in steps.items():
                if batches:
                    step = functools.partial(self.step_thread.step, batches, parts, forwarded)
                    out.extend(await asyncio.to_thread(step))
        self.laps.lap("step and ledger")
        self.telemetry.acknowledged(out.event_ts)
        for tp, offset in after.items():
            self.slots.held[tp.partition].positions[tp] = offset
        # the alerter's batch beside the slots' transactions: another slot, another
        # transaction, and both wait on the brokers (its own store comes after the step's)
        await asyncio.gather(
            self._commit(parts, {tp.partition for tp in after}), self._alert_batch(deaths)
        )
        self.laps.lap("transactions and the alerter's batch")
        await self._after(out)
        self.laps.lap("alert sinks")

    async def _alert_batch(self, deaths: list[InRecord]) -> None:
        if deaths:
            out = await self.alerts.batch(deaths, self.checkpoint, self.store, self.notifiers.send)
            self.stats.update(out.stats)

    async def _commit(self, parts: dict[int, Output], slots: set[int],
                      ends: dict[TopicPartition, int] | None = None) -> None:  # fmt: skip
        """Step 2 of the checkpoint for ``slots`` (those held) and the lanes' reports."""
        now = self.clock()
        reports = self.watch.reports(now, ends)
        touched = slots | {slot_of(lane) for lane in reports}
        commits = {p: self.slots.commit_of(p, parts, reports, now, self.watch.repeats)
                   for p in sorted(touched) if p in self.slots.held}  # fmt: skip
        fenced = await self.slots.commit(commits)
        self.watch.sent(reports, now, fenced)
        self._report_figures()

    async def _after(self, out: Output) -> None:
        self.slots.note_forwarded(out)
        self.stats.update(out.stats)
        self.telemetry.outcomes(out.stats)
        if out.ledger.alerts:
            await self.notifiers.send(out.ledger.alerts)
        self.telemetry.write_stats()

    # -- time ---------------------------------------------------------------------------
    async def _tick(self) -> None:
        """Grace periods of quiet lanes, staleness on the shared watermark, lane reports."""
        held = [tp for p in self.slots.held for tp in self.slots.tps(p)]
        consumed = await self.consumer.positions([*held, self.alerts.tp])
        self.laps.lap("positions")
        undelivered = await self.watch.undelivered(consumed)
        self.laps.lap("reading back")
        if undelivered:
            await self._batch(undelivered)
            return  # a batch was stepped: the next tick ticks
        now = self.clock()
        try:
            async with asyncio.timeout(self.pace.target_s):
                ends = await self.consumer.end_offsets(held)
        except Exception:  # the broker is away: the next tick asks again
            log.debug("end offsets unavailable this tick", exc_info=True)
            return
        finally:
            self.laps.lap("end offsets")
        self.marks.apply(self.intake.clock, self.slots.lanes(), now)
        self.watch.release_copies(self.marks.copies)
        moved = self.watch.past_markers(consumed)
        await self.alerts.markers(consumed.get(self.alerts.tp), self.checkpoint)
        self.laps.lap("the alerter's markers")
        self.watch.at_ends(ends)
        self.gc.maybe_collect()  # a full pass between batches, not inside one
        self.laps.lap("collector")
        outs = await asyncio.to_thread(  # seconds of shrinks after a jump: off the loop
            self.intake.tick, now, self._tick_interval, held=self.slots.lanes()  # not parked
        )  # fmt: skip
        self.laps.lap("step")
        out = self.slots.tick_output(outs)
        out.ledger.progress.extend(self.watch.progress(now, ends, self.telemetry.last_batch_at))
        if len(out.ledger):
            try:
                await asyncio.to_thread(self.store, out)
            except PermanentStoreError:
                self.intake.rollback(outs)
                log.exception("the ledger refused rows of the timer; they are retried next tick")
                return
            finally:
                self.laps.lap("ledger")
        self.intake.commit(outs)
        self.laps.note(f"the lanes' tick wrote {sum(len(o.state_writes) for o in outs.values()):,} "
                       f"states and {len(out.ledger):,} rows, {dict(out.stats)}")  # fmt: skip
        touched = {slot_of(lane) for lane, o in outs.items()
                   if o.state_writes or o.records or o.limit_deaths or o.ledger.usage}  # fmt: skip
        await self._commit(dict(outs), moved | touched, ends)
        self.laps.lap("transactions")
        await self._after(out)
        self.laps.lap("alert sinks")

    # -- lifecycle ----------------------------------------------------------------------
    def _report_figures(self) -> None:
        self.telemetry.extra.update(
            self.slots.figures(), fenced_writes=self.checkpoint.fenced_writes,
            rebalances=self.rebalances, batch_limit=self.pace.limit(),
            loop_held_max_s=round(self.loop_watch.longest_s, 1), **self.gc.figures(),
            **self.alerts.figures(), **self.intake.clock.figures(),
        )  # fmt: skip

    async def _shutdown(self, marks: asyncio.Future[None]) -> None:
        """Leave the group (the others take the slots over), close clients, write stats."""
        self._stopping = True
        self.loop_watch.stop()
        try:
            async with asyncio.timeout(30.0):
                await self.consumer.stop()
        except Exception:
            log.warning("the consumer did not leave the group cleanly", exc_info=True)
        marks.cancel()
        await self.notifiers.aclose()
        self._report_figures()
        self.telemetry.stopped()
        await self.transactions.close_all()
        await self.watch.close()
        await self.marks.close()
        await self.slots.reader.close()
        await self.alerts.close()
