"""The budget desk: spend budgets settled at the watermark, a function of the set of rows.

One desk sees every lane's spend rows and reports (the worker routes them through the
single-partition ``<prefix>.limit-deaths`` topic, as limit deaths reach the one
``ExhaustionAlerter``). It keeps the latest version of every usage row of the open
periods, so a re-delivered row or a re-stepped batch changes nothing and a retraction or
a re-stated owner takes the row's amount out of one scope and puts it into another.

Spend is *settled* up to the pipeline-wide watermark less the allowed lateness (the
alerter's watermark: the lanes' marks, held back by lanes still reading and by runs
waiting to close; schemas/CONTRACT.md rule 16) and *provisional* beyond it. A threshold
fires at the event time of the row that lifts the period's settled spend to it (once per
scope, threshold and period: ``budget_threshold:<scope id>:<threshold>:<period start>``)
and resolves when the period ends; both are decided only when the settled time passes
them, never at arrival. A row (or a change of one) for a time already settled is counted
``late``: it counts in its own period from the first unsettled instant on, and decided
alerts are not re-opened. A row older than the period before the settled one is dropped
uncounted (``dropped``): it can change no alert still to decide.

Example::

    desk = BudgetDesk(read_budgets("budgets.toml"), lateness_s=30, lanes=[0, 1, 2])
    alerts, states = desk.step(values)   # values of the limit-deaths records
    # alerts -> the ledger and prism.alerts; states -> prism.budget-state (compacted)
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Context, Decimal, localcontext

import orjson

from prism.pipeline.core import LaneReport, OutRecord, decision_time, reports_watermark
from prism.schemas import AlertRow

from ._config import Budget, Budgets
from ._period import period_bounds
from ._records import budget_alert, money, state_record, state_value
from ._spend import SpendRow, decode_budget_input

__all__ = ["BudgetDesk"]

_NEVER = -(1 << 62)
_EXACT = Context(prec=80)  # sums stay exact, so they do not depend on the order of adding


@dataclass(slots=True)
class _Entry:
    """One row's part of one budget's period."""

    eff_us: int  # when it counts: its event time, or the first unsettled instant if late
    amount: Decimal | None  # in the budget's currency
    unconverted: tuple[str, Decimal] | None
    at_risk: tuple[int, int] | None  # estimated (input, output) tokens
    run_id: str
    model: str | None


@dataclass(slots=True)
class _Period:
    start_us: int
    end_us: int
    entries: dict[str, _Entry] = field(default_factory=dict)
    pending: dict[str, _Entry] = field(default_factory=dict)  # priced, not yet settled
    settled: Decimal = Decimal(0)
    total: Decimal = Decimal(0)
    unconverted: dict[str, Decimal] = field(default_factory=lambda: defaultdict(Decimal))
    at_risk: list[int] = field(default_factory=lambda: [0, 0, 0])


class BudgetDesk:
    """Every budget of ``budgets`` over the spend rows and lane reports of all lanes.

    ``observe`` and ``report`` only record; ``decide`` returns the alert rows whose times
    the settled time passed since the last call; ``states`` the budget-state records.
    ``step`` does all four for one batch of ``limit-deaths`` values.
    """

    def __init__(
        self, budgets: Budgets, lateness_s: float = 0.0, lanes: Iterable[int] | None = None
    ) -> None:
        self.budgets: tuple[Budget, ...] = budgets.budgets
        self.config = budgets
        self.lateness_us = int(lateness_s * 1_000_000)
        self.expected: frozenset[int] | None = None if lanes is None else frozenset(lanes)
        self.rows: dict[str, tuple[SpendRow, int]] = {}  # event id -> (latest row, eff us)
        self.periods: dict[tuple[int, int], _Period] = {}  # (budget index, start us)
        # (budget index, period start) -> threshold label -> firing time; resolved periods
        self.fired: dict[tuple[int, int], dict[str, int]] = {}
        self.resolved: set[tuple[int, int]] = set()
        self.lanes: dict[int, LaneReport] = {}
        self.watermark_us = 0
        self.decided_us = _NEVER  # spend at or before this is settled
        self.late = 0
        self.dropped = 0
        self._sent: dict[str, bytes] = {}  # scope id -> last state value produced
        self._dirty: set[str] = set()  # event ids changed since the last ``state_writes``
        self._horizon_us = _NEVER  # rows before this are dropped (``_horizon``)
        self._kept: list[int] = []  # ``_keep`` at the last prune
        self._last_span: dict[int, tuple[int, int]] = {}  # budget index -> a period
        # tenant -> its budgets (index, budget, scope dimensions), so a row is matched
        # only against the budgets of its own tenant
        self._by_tenant: dict[str, list[tuple[int, Budget, list[tuple[str, str]]]]] = {}
        for i, b in enumerate(self.budgets):
            self._by_tenant.setdefault(b.scope.tenant, []).append((i, b, b.scope.items()))

    def expect(self, lanes: Collection[int]) -> None:
        """The lanes the watermark waits for (the input's partitions)."""
        self.expected = frozenset(lanes)

    # -- the worker's entry point ---------------------------------------------------------
    def step(
        self, values: Iterable[bytes | None], *, final: bool = False
    ) -> tuple[list[AlertRow], list[OutRecord]]:
        """One batch of ``limit-deaths`` values in: the alert rows decided and the
        budget-state records that changed out."""
        rows, reports = decode_budget_input(values)
        self.observe(rows)
        for lane, report in reports.items():
            self.report(lane, report)
        alerts = self.decide(final=final)
        return alerts, self.states()

    # -- input ----------------------------------------------------------------------------
    def observe(self, rows: Iterable[SpendRow]) -> None:
        """Record rows; a row's higher version replaces its earlier one (a lower or equal
        version is a re-delivery and changes nothing)."""
        with localcontext(_EXACT):
            for r in rows:
                old = self.rows.get(r.event_id)
                if old is not None and r.version <= old[0].version:
                    continue
                if r.ts_us < self._horizon_us and old is None:
                    self.dropped += 1
                    continue
                eff = r.ts_us
                if min(r.ts_us, old[0].ts_us if old else r.ts_us) <= self.decided_us:
                    if r.kind != "none" or (old is not None and old[0].kind != "none"):
                        self.late += 1
                    eff = max(r.ts_us, self.decided_us + 1)
                if old is not None:
                    self._remove(old[0])
                self.rows[r.event_id] = (r, eff)
                self._dirty.add(r.event_id)
                self._add(r, eff)

    def report(self, lane: int, report: LaneReport) -> None:
        """Record a lane's latest report (it replaces the lane's last one)."""
        self.lanes[lane] = report

    def _parts(self, r: SpendRow) -> Iterable[tuple[int, Budget, tuple[int, int], _Entry]]:
        """The row's entry in each budget whose scope holds it."""
        if r.kind == "none" or r.tenant is None:
            return
        owner = r.owner()
        for i, b, dims in self._by_tenant.get(r.tenant, ()):
            if any(owner[d] != v for d, v in dims):
                continue
            amount, unconverted, at_risk = None, None, None
            if r.kind == "estimated":
                at_risk = (r.input_tokens, r.output_tokens)
            elif r.cost is None or r.currency is None:
                continue  # unpriced: billing shows it without a cost; no spend
            elif r.currency == b.currency:
                amount = r.cost
            elif (rate := self.config.rate(r.currency, b.currency, r.ts_us)) is not None:
                amount = r.cost * rate
            else:
                unconverted = (r.currency, r.cost)
            span = self._span_at(i, r.ts_us)
            yield i, b, span, _Entry(0, amount, unconverted, at_risk, r.run_id, r.model)

    def _add(self, r: SpendRow, eff: int) -> None:
        for i, _, span, e in self._parts(r):
            e.eff_us = eff
            p = self.periods.get((i, span[0]))
            if p is None:
                p = self.periods[(i, span[0])] = _Period(*span)
            p.entries[r.event_id] = e
            if e.amount is not None:
                p.total += e.amount
                if eff <= self.decided_us:
                    p.settled += e.amount
                else:
                    p.pending[r.event_id] = e
            if e.unconverted is not None:
                p.unconverted[e.unconverted[0]] += e.unconverted[1]
            if e.at_risk is not None:
                p.at_risk[0] += 1
                p.at_risk[1] += e.at_risk[0]
                p.at_risk[2] += e.at_risk[1]

    def _remove(self, r: SpendRow) -> None:
        for i, _, span, _ in self._parts(r):
            p = self.periods.get((i, span[0]))
            e = None if p is None else p.entries.pop(r.event_id, None)
            if p is None or e is None:
                continue
            if e.amount is not None:
                p.total -= e.amount
                if p.pending.pop(r.event_id, None) is None:
                    p.settled -= e.amount
            if e.unconverted is not None:
                p.unconverted[e.unconverted[0]] -= e.unconverted[1]
            if e.at_risk is not None:
                p.at_risk[0] -= 1
                p.at_risk[1] -= e.at_risk[0]
                p.at_risk[2] -= e.at_risk[1]

    # -- deciding -------------------------------------------------------------------------
    def watermark(self) -> int | None:
        """The pipeline-wide watermark the lanes' reports give (None: not all reported),
        as the exhaustion alerter takes it."""
        return reports_watermark(self.lanes, self.expected)

    def decide(self, *, final: bool = False) -> list[AlertRow]:
        """The firing and resolved rows at times the settled time (the watermark less the
        allowed lateness; the watermark itself at ``final`` or when every lane is quiet
        with no run waiting to close) passed since the last call."""
        self.watermark_us, until = decision_time(
            self.lanes, self.expected, self.watermark_us, self.lateness_us, final=final
        )
        if until is None or until <= self.decided_us:
            return []
        rows: list[AlertRow] = []
        with localcontext(_EXACT):
            for key in sorted(self.periods):
                rows += self._sweep(key, self.periods[key], until)
            for key in sorted(self.fired):
                b, (start, end) = self.budgets[key[0]], self._span(key)
                if end <= until and key not in self.resolved:
                    self.resolved.add(key)
                    p = self.periods.get(key)
                    spent = p.settled if p is not None else Decimal(0)
                    for label, amount in b.threshold_amounts():
                        if label in self.fired[key]:
                            rows.append(
                                budget_alert(b, label, amount, (start, end), "resolved", end, spent)
                            )
        self.decided_us = until
        self._prune()
        rows.sort(key=lambda r: (r.ts, r.alert_id, r.state))
        return rows

    def _span(self, key: tuple[int, int]) -> tuple[int, int]:
        return self._span_at(key[0], key[1])

    def _span_at(self, i: int, ts_us: int) -> tuple[int, int]:
        """The period of budget ``i`` holding ``ts_us`` (the last one found is reused)."""
        last = self._last_span.get(i)
        if last is not None and last[0] <= ts_us < last[1]:
            return last
        b = self.budgets[i]
        span = self._last_span[i] = period_bounds(b.period, b.tz, ts_us)
        return span

    def _sweep(self, key: tuple[int, int], p: _Period, until: int) -> list[AlertRow]:
        """Settle the period's entries up to ``until``; fire each threshold at the time the
        settled spend reaches it (never for a period that ended before this decision)."""
        movers = sorted((e.eff_us, eid) for eid, e in p.pending.items() if e.eff_us <= until)
        if not movers:
            return []
        b = self.budgets[key[0]]
        fired = self.fired.get(key, {})
        open_ = p.end_us > self.decided_us and key not in self.resolved
        todo = [(label, a) for label, a in b.threshold_amounts() if label not in fired]
        rows = []
        i = 0
        while i < len(movers):
            at = movers[i][0]
            while i < len(movers) and movers[i][0] == at:
                e = p.pending.pop(movers[i][1])
                p.settled += e.amount or Decimal(0)
                i += 1
            if not open_ or at >= p.end_us:
                continue
            for label, amount in [t for t in todo if p.settled >= t[1]]:
                todo.remove((label, amount))
                self.fired.setdefault(key, {})[label] = at
                span, top = (p.start_us, p.end_us), self._top(p, at)
                rows.append(budget_alert(b, label, amount, span, "firing", at, p.settled, top))
        return rows

    @staticmethod
    def _top(p: _Period, at: int) -> str:
        """The three runs and models with the most settled spend at ``at``."""
        runs: dict[str, Decimal] = defaultdict(Decimal)
        models: dict[str, Decimal] = defaultdict(Decimal)
        for e in p.entries.values():
            if e.amount is not None and e.eff_us <= at:
                runs[e.run_id] += e.amount
                models[e.model or "?"] += e.amount

        def best(d: dict[str, Decimal]) -> str:
            top = sorted(d.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
            return ", ".join(f"{k} {money(v)}" for k, v in top)

        return f"top runs: {best(runs)}; top models: {best(models)}"

    def _keep(self) -> list[int]:
        """Per budget, the start of the period before the settled one: older periods are
        forgotten."""
        out = []
        for b in self.budgets:
            start, _ = period_bounds(b.period, b.tz, self.decided_us)
            out.append(period_bounds(b.period, b.tz, start - 1)[0])
        return out

    def _horizon(self, keep: list[int] | None = None) -> int:
        """Rows before this are dropped: older than every budget's kept periods."""
        if self.decided_us == _NEVER:
            return _NEVER
        if not self.budgets:
            return self.decided_us
        return min(self._keep() if keep is None else keep)

    def _prune(self) -> None:
        keep = self._keep()
        if keep == self._kept and self.budgets:
            return  # no period left since the last time
        self._kept = keep
        horizon = self._horizon_us = self._horizon(keep)
        for key in [k for k in self.periods if k[1] < keep[k[0]]]:
            del self.periods[key]
        for key in [k for k in self.fired if k[1] < keep[k[0]]]:
            del self.fired[key]
            self.resolved.discard(key)
        for eid in [eid for eid, (r, _) in self.rows.items() if r.ts_us < horizon]:
            del self.rows[eid]
            self._dirty.add(eid)

    # -- output ---------------------------------------------------------------------------
    def states(self, *, changed_only: bool = True) -> list[OutRecord]:
        """The ``prism.budget-state`` record of each budget's settled period (only those
        that changed since last produced, unless ``changed_only`` is False)."""
        if self.decided_us == _NEVER:
            return []
        out = []
        with localcontext(_EXACT):
            for i, b in enumerate(self.budgets):
                span = period_bounds(b.period, b.tz, self.decided_us)
                p = self.periods.get((i, span[0])) or _Period(*span)
                fired = self.fired.get((i, span[0]), {})
                crossed = [label for label, _ in b.threshold_amounts() if label in fired]
                at_risk = (p.at_risk[0], p.at_risk[1], p.at_risk[2])
                value = state_value(
                    b, span, p.settled, p.total, at_risk, dict(p.unconverted), crossed
                )
                sig = orjson.dumps(value)
                if changed_only and self._sent.get(b.scope_id) == sig:
                    continue
                # held until the next change, copied to its size: orjson's result keeps
                # the buffer it grew (about 8 KiB for a state of a few hundred bytes)
                self._sent[b.scope_id] = bytes(memoryview(sig))
                out.append(state_record(b, value, self.decided_us))
        return out

    # -- state (``_state``: one record, or one record per row for a changelog) ---------
    def to_bytes(self) -> bytes:
        """The desk's state in one record (rows, decisions, lane reports; not the budgets)."""
        from ._state import dump

        return dump(self)

    @classmethod
    def from_bytes(cls, raw: bytes, budgets: Budgets) -> BudgetDesk:
        """The desk ``to_bytes`` wrote, over ``budgets`` (a budget added since starts from
        the rows kept; one removed is forgotten). Another format version is refused."""
        from ._state import load

        return load(cls, raw, budgets)

    def state_writes(self) -> dict[bytes, bytes | None]:
        """The state records that changed since the last call, for a compacted changelog:
        the desk's header (``STATE_KEY``) and one record per changed usage row (None: the
        row was forgotten; delete its key). ``from_state`` reads them all back."""
        from ._state import writes

        return writes(self)

    @classmethod
    def from_state(cls, records: Mapping[bytes, bytes], budgets: Budgets) -> BudgetDesk:
        """The desk whose ``state_writes`` left ``records`` (key -> latest value)."""
        from ._state import load_records

        return load_records(cls, records, budgets)
