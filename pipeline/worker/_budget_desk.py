"""Spend budgets in the worker (docs/BUDGETS.md): each lane's spend out, the one desk's in.

Two halves, both on when ``PRISM_BUDGETS_FILE`` is set:

- **Lanes** (``LaneSpend``): each held slot's transaction carries its lanes' spend records
  (``budgets.spend_records`` of the rows the step stored, priced by the ledger's price
  book) to the single-partition ``<prefix>.limit-deaths`` topic, before the lane's
  event-time report of the same transaction (``_slots.Slots.commit_of``). A re-stepped
  batch sends the same rows with the same versions; the desk keeps one of each.
- **Desk** (``WorkerBudgetDesk``): whichever worker holds that partition steps the
  ``BudgetDesk`` with the same values the exhaustion alerter decodes (``_alerter``). The
  batch's ``alerter`` transaction carries the desk's alert records, its changed
  ``<prefix>.budget-state`` records, its changelog writes (``<group>-budget-state-changelog``,
  compacted: a header and one record per usage row) and the partition's offset, so the
  decisions, the state and the position move together or not at all. The next holder
  fences this one, reads the changelog back and the values again from the committed
  offset: the desk is a function of the set of records, so it decides the same rows.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..budgets import BudgetDesk, Budgets, BudgetStateError, PriceBook, read_budgets, spend_records
from ..core import CoreConfig, Output, OutRecord
from ..settings import Settings
from ._produce import ProducedRecord
from ._state import StateReader

__all__ = ["LaneSpend", "WorkerBudgetDesk"]

log = logging.getLogger("prism.worker")

PRICE_REFRESH_S = 300.0  # how often the lanes read the price book again


class LaneSpend:
    """A lane output's spend records (``Slots.spend``): its ``provider_turn`` usage rows,
    priced by the runtime's cost or the price book (read through ``prices`` at first use
    and every ``refresh_s`` seconds after; unreadable: the rows go unpriced, as billing
    shows a row it cannot price)."""

    def __init__(
        self,
        prices: Callable[[], Iterable[Any]] | None,
        *,
        refresh_s: float = PRICE_REFRESH_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.prices = prices
        self.refresh_s = refresh_s
        self.clock = clock
        self.book: PriceBook | None = None
        self._read_at: float | None = None

    def __call__(self, out: Output) -> list[OutRecord]:
        if not out.ledger.usage:
            return []
        return spend_records(out, self._book())

    def _book(self) -> PriceBook | None:
        now = self.clock()
        if self.prices is None or (
            self._read_at is not None and now - self._read_at < self.refresh_s
        ):
            return self.book
        self._read_at = now
        try:
            self.book = PriceBook(self.prices())
        except Exception as exc:  # the last book read stays; none: rows go unpriced
            by = "the book read before" if self.book else "the runtimes' costs only"
            log.warning("the price book could not be read (%s); spend is priced by %s", exc, by)
        return self.book


class WorkerBudgetDesk:
    """The budget desk as the holder of ``limit-deaths`` runs it (module docstring).

    ``step`` takes a batch's values and returns the alert rows decided; ``records`` the
    budget-state records and changelog writes for the same transaction; ``forget`` drops
    the copy in memory (reassigned, or fenced), and the next ``step`` reads it back.
    """

    def __init__(
        self, settings: Settings, config: CoreConfig, budgets: Budgets | None = None
    ) -> None:
        assert settings.budgets_file is not None or budgets is not None
        self.budgets = budgets if budgets is not None else read_budgets(settings.budgets_file or "")
        self.changelog = f"{settings.consumer_group}-budget-state-changelog"
        self.topic = settings.topics.budget_state
        self.reader = StateReader(self.changelog, settings.aiokafka_kwargs())
        self.partitions = settings.partitions
        self.lateness_s = config.lateness_s
        self.desk: BudgetDesk | None = None
        self._states: list[OutRecord] = []  # changed since the last ``records``

    async def step(self, values: Sequence[bytes | None]) -> tuple[list[Any], dict[str, int]]:
        """The alert rows the settled time decided, and counts (late and dropped rows)."""
        desk = await self._restored()
        late, dropped = desk.late, desk.dropped
        alerts, states = desk.step(values)
        self._states.extend(states)
        stats = {
            "budgets.alerts": len(alerts),
            "budgets.late_rows": desk.late - late,
            "budgets.dropped_rows": desk.dropped - dropped,
        }
        return alerts, stats

    def records(self) -> list[ProducedRecord]:
        """The budget-state records and the desk's changelog writes since the last call."""
        if self.desk is None:
            return []
        out = [ProducedRecord(self.topic, r.key, r.value, None, r.headers) for r in self._states]
        self._states = []
        out += [
            ProducedRecord(self.changelog, k, v, 0) for k, v in self.desk.state_writes().items()
        ]
        return out

    def forget(self) -> None:
        self.desk = None
        self._states = []

    async def _restored(self) -> BudgetDesk:
        if self.desk is None:
            stored = await self.reader.read(0)
            desk = None
            if stored:
                try:
                    desk = BudgetDesk.from_state(stored, self.budgets)
                except BudgetStateError as exc:  # as the exhaustion alerter: start over
                    log.warning("%s; the budget desk starts over", exc)
            if desk is None:
                desk = BudgetDesk(self.budgets, self.lateness_s, range(self.partitions))
            desk.expect(range(self.partitions))
            log.info("budget desk: %d budgets, %d usage rows of open periods read back",
                     len(self.budgets.budgets), len(desk.rows))  # fmt: skip
            self.desk = desk
        return self.desk

    async def close(self) -> None:
        await self.reader.close()
