"""The worker group's one exhaustion alerter (schemas/CONTRACT.md rule 16), as a worker runs it.

Whichever worker holds the single partition of ``<prefix>.limit-deaths`` steps it: every
lane's limit deaths and event-time reports arrive there in order. ``AlertDesk.step``
records a batch of them and returns the rows the watermark has decided; the worker stores,
produces and notifies those, then ``save`` writes the alerter's state to its compacted
changelog, but only while this process still holds the partition. Otherwise it forgets
its copy: the next holder reads the state back (``_state.StateReader``) and the deaths
again from the group's committed offset.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from prism.schemas import LedgerBatch

from ..core import CoreConfig, ExhaustionAlerter, Output, alert_record, decode_alerter_input
from ..settings import Settings
from ._produce import ProducedRecord, RecordProducer
from ._state import StateReader

__all__ = ["STATE_KEY", "AlertDesk"]

log = logging.getLogger("prism.worker")

STATE_KEY = b"alerter"  # the alerter's one key in its changelog


class AlertDesk:
    """The alerter of a worker, its state read back and written by the worker itself."""

    def __init__(self, settings: Settings, config: CoreConfig, producer: RecordProducer) -> None:
        self.changelog = f"{settings.consumer_group}-alert-state-changelog"
        self.reader = StateReader(self.changelog, settings.aiokafka_kwargs())
        self.topic = settings.topics.limit_deaths
        self.partitions = settings.partitions
        self.config = config
        self.producer = producer
        self.alerter: ExhaustionAlerter | None = None

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
        out = Output(ledger=LedgerBatch(alerts=rows))
        out.stats["alerts.late_deaths"] = alerter.late - late
        if rows:
            out.ranges.append((self.topic, 0, first, last))
            out.alerts.extend(alert_record(r) for r in rows)
        return out

    async def save(self, *, still_held: bool) -> None:
        """Write the state after a batch's rows are stored and produced; ``still_held``:
        no rebalance began since the batch and this process holds limit-deaths."""
        if self.alerter is None:
            return
        if not still_held:
            log.info("alerter state not written: limit-deaths was reassigned")
            self.alerter = None
            return
        state = ProducedRecord(self.changelog, STATE_KEY, self.alerter.to_bytes(), 0)
        await self.producer.send_all([state])

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
