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

import logging
from collections.abc import Sequence

from aiokafka import TopicPartition

from prism.schemas import LedgerBatch

from ..core import CoreConfig, ExhaustionAlerter, Output, alert_record, decode_alerter_input
from ..settings import Settings
from ._budget_desk import WorkerBudgetDesk
from ._checkpoint import SlotCommit
from ._produce import ProducedRecord
from ._state import StateReader

__all__ = ["STATE_KEY", "AlertDesk"]

log = logging.getLogger("prism.worker")

STATE_KEY = b"alerter"  # the alerter's one key in its changelog


class AlertDesk:
    """The alerter of a worker, its state read back and written by the worker itself."""

    def __init__(self, settings: Settings, config: CoreConfig) -> None:
        self.changelog = f"{settings.consumer_group}-alert-state-changelog"
        self.reader = StateReader(self.changelog, settings.aiokafka_kwargs())
        self.topic = settings.topics.limit_deaths
        self.partitions = settings.partitions
        self.config = config
        self.alerter: ExhaustionAlerter | None = None
        self.position: int | None = None  # the next offset of limit-deaths to step
        self.budgets = WorkerBudgetDesk(settings, config) if settings.budgets_file else None

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

    def figures(self, held: bool) -> dict[str, object]:
        """The alerter's clock for the worker's stats file (None: not ``held`` here)."""
        a = self.alerter if held else None
        return {
            "alerts_watermark_us": None if a is None else a.watermark_us,
            "alerts_decided_us": None if a is None else a.decided_us,
        }

    def commit_of(self, out: Output, alerts_topic: str, next_offset: int) -> SlotCommit:
        """The ``alerter`` slot's transaction for a stepped batch: its alert records, the
        alerter's state, the budget desk's records and the partition's next offset."""
        recs = [ProducedRecord(alerts_topic, r.key, r.value, None, r.headers) for r in out.alerts]
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
