"""The worker group's one exhaustion alerter (schemas/CONTRACT.md rule 16), as a worker runs it.

Whichever worker holds the single partition of ``<prefix>.limit-deaths`` steps it: every
lane's limit deaths and event-time reports arrive there in order. ``AlertDesk.step``
records a batch of them and returns the rows the watermark has decided; the worker stores
those, then commits the alerts, the alerter's state (``state_record``, to its compacted
changelog) and the partition's offset in one transaction of the ``alerter`` slot
(``_checkpoint``). The next holder fences that producer, reads the state back
(``_state.StateReader``) and the deaths again from the committed offset.

With spend budgets on (``PRISM_BUDGETS_FILE``) the budget desk steps the same values
(``_budget_desk``): its alert rows join the alerter's, and its budget-state records and
state writes go in the same transaction.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from aiokafka import TopicPartition

from prism.schemas import AlertRow, LedgerBatch

from ..core import (
    CoreConfig,
    ExhaustionAlerter,
    InRecord,
    Output,
    alert_record,
    decode_alerter_input,
)
from ..settings import Settings
from ._budget_desk import WorkerBudgetDesk
from ._checkpoint import ALERTER, Checkpoint, Dropped, Fenced, SlotCommit, Transactions
from ._consumer import GroupConsumer
from ._produce import ProducedRecord
from ._state import StateReader

__all__ = ["STATE_KEY", "AlertDesk"]

log = logging.getLogger("prism.worker")

STATE_KEY = b"alerter"  # the alerter's one key in its changelog


class AlertDesk:
    """The alerter of a worker, its state read back and written by the worker itself;
    ``held`` while the group assigns the limit-deaths partition (``tp``) here."""

    def __init__(self, settings: Settings, config: CoreConfig) -> None:
        self.changelog = f"{settings.consumer_group}-alert-state-changelog"
        self.reader = StateReader(self.changelog, settings.aiokafka_kwargs())
        self.topic = settings.topics.limit_deaths
        self.alerts_topic = settings.topics.alerts
        self.tp = TopicPartition(self.topic, 0)
        self.held = False
        self.partitions = settings.partitions
        self.config = config
        self.alerter: ExhaustionAlerter | None = None
        self.position: int | None = None  # the next offset of limit-deaths to step
        self.fenced_at: Dropped | None = None  # when a commit of the alerter was fenced here
        self.budgets = WorkerBudgetDesk(settings, config) if settings.budgets_file else None

    async def take(self, consumer: GroupConsumer, transactions: Transactions) -> None:
        """Hold the alerter: a new producer of its slot fences the last holder first, the
        state is read back at the first step, the deaths from the committed offset on."""
        await transactions.open(ALERTER)
        self.forget()
        self.held = True
        self.fenced_at = None
        done = await consumer.committed([self.tp])
        self.position = done[self.tp][0] if done else None

    async def give_up(self, transactions: Transactions) -> None:
        """The partition was revoked: another process holds the alerter next."""
        self.held = False
        self.fenced_at = None
        self.forget()
        await transactions.close(ALERTER)

    async def batch(
        self,
        records: list[InRecord],
        checkpoint: Checkpoint,
        store: Callable[[Output], None],
        send: Callable[[list[AlertRow]], Awaitable[None]],
    ) -> Output:
        """Step the fetched ``records`` the alerter has not stepped, ``store`` the alerts
        decided (in a thread), commit them with the state and the offset in the alerter's
        transaction, then ``send`` them; fenced, the alerter is let go instead."""
        start = self.position or 0  # a record below it was stepped (a stale fetch)
        records = [r for r in records if r.offset >= start]
        if not records or not self.held:
            return Output()
        first, last = records[0].offset, records[-1].offset
        out = await self.step([r.value for r in records], first, last)
        if out.ledger.alerts:
            await asyncio.to_thread(store, out)
        commit = self.commit_of(out, last + 1)
        fenced = await checkpoint.commit({ALERTER: commit})
        if fenced:  # the holder moved on, or the commit was lost
            self._fenced(fenced[ALERTER])
        elif out.ledger.alerts:
            await send(out.ledger.alerts)
        return out

    async def markers(self, consumed: int | None, checkpoint: Checkpoint) -> None:
        """Commit the partition's offset past transaction markers (``past_markers``)."""
        commit = self.past_markers(consumed) if self.held else None
        fenced = {} if commit is None else await checkpoint.commit({ALERTER: commit})
        if fenced:
            self._fenced(fenced[ALERTER])

    def _fenced(self, why: Fenced) -> None:
        """Let the alerter go: another process holds it, or takes it back (``reclaim``)."""
        self.held = False
        self.forget()
        self.fenced_at = Dropped.of(why)

    async def reclaim(
        self, consumer: GroupConsumer, transactions: Transactions, after_s: float
    ) -> bool:
        """Take the alerter back, as ``Slots.reclaim`` takes slots back: fenced more than
        ``after_s`` ago, or only lost, while the group still assigns its partition here.
        Otherwise no process would page for limit deaths until the next rebalance."""
        if self.fenced_at is None or not self.fenced_at.due(after_s, time.monotonic()):
            return False
        self.fenced_at = None
        if self.tp not in consumer.assignment():
            return False
        log.warning("the alerter: fenced but still assigned here; taking it back")
        await self.take(consumer, transactions)
        return True

    async def step(self, values: Sequence[bytes | None], first: int, last: int) -> Output:
        """The deaths and lane reports of limit-deaths offsets ``first..last`` in; the rows
        the watermark decided out, with ``stats['alerts.late_deaths']``: deaths that came
        for a time already decided."""
        alerter = await self._restored()
        deaths, reports = decode_alerter_input(values)
        late = alerter.late
        alerter.observe(deaths)
        for lane, report in reports.items():
            alerter.report(lane, report)
        rows = alerter.decide()
        stats = {"alerts.late_deaths": alerter.late - late}
        if self.budgets is not None:
            spent, budget_stats = await self.budgets.step(values)
            rows = [*rows, *spent]
            stats.update(budget_stats)
        out = Output(ledger=LedgerBatch(alerts=rows))
        out.stats.update(stats)
        if rows:
            out.ranges.append((self.topic, 0, first, last))
            out.alerts.extend(alert_record(r) for r in rows)
        return out

    def figures(self) -> dict[str, object]:
        """The alerter's clock for the worker's stats file (None: not held here)."""
        a = self.alerter if self.held else None
        return {
            "alerts_watermark_us": None if a is None else a.watermark_us,
            "alerts_decided_us": None if a is None else a.decided_us,
        }

    def commit_of(self, out: Output, next_offset: int) -> SlotCommit:
        """The ``alerter`` slot's transaction for a stepped batch: its alert records, the
        alerter's state, the budget desk's records and the partition's next offset."""
        recs = [
            ProducedRecord(self.alerts_topic, r.key, r.value, None, r.headers) for r in out.alerts
        ]
        state = self.state_record()
        if state is not None:
            recs.append(state)
        if self.budgets is not None:
            recs += self.budgets.records()
        self.position = next_offset
        return SlotCommit(recs, {TopicPartition(self.topic, 0): next_offset})

    def past_markers(self, consumer_position: int | None) -> SlotCommit | None:
        """The partition's offset alone, when the consumer's position has moved past the
        alerter's over offsets that hold no record it was handed (transaction markers:
        every lane writes here in transactions); None when it has not."""
        if self.position is None or consumer_position is None:
            return None
        if consumer_position <= self.position:
            return None
        self.position = consumer_position
        return SlotCommit([], {TopicPartition(self.topic, 0): consumer_position})

    def state_record(self) -> ProducedRecord | None:
        """The alerter's state as a changelog record, for the transaction of its batch."""
        if self.alerter is None:
            return None
        return ProducedRecord(self.changelog, STATE_KEY, self.alerter.to_bytes(), 0)

    def forget(self) -> None:
        """Drop the copy in memory: the next step reads the state back (the partition was
        assigned anew, or this process's write was fenced)."""
        self.alerter = None
        self.position = None
        if self.budgets is not None:
            self.budgets.forget()

    async def _restored(self) -> ExhaustionAlerter:
        """The alerter, read back from its changelog the first time; it waits for a report
        from each partition of the input before it decides anything."""
        if self.alerter is None:
            raw = (await self.reader.read(0)).get(STATE_KEY)
            cfg = self.config
            alerter = None
            if raw:
                try:
                    alerter = ExhaustionAlerter.from_bytes(raw)
                except ValueError as exc:  # an older format: decide again from here on
                    log.warning("%s; the alerter starts over", exc)
            if alerter is None:
                alerter = ExhaustionAlerter(cfg.alert_window_s, cfg.alert_threshold, cfg.lateness_s)
            alerter.expect(range(self.partitions))
            self.alerter = alerter
        return self.alerter

    async def close(self) -> None:
        await self.reader.close()
        if self.budgets is not None:
            await self.budgets.close()
