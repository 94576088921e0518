"""What a lane sends the budget desk: the billable spend of a batch's ledger rows.

Spend is what ``billing`` bills (schemas/CONTRACT.md rules 5, 6 and 10): ``provider_turn``
usage that is neither retracted nor a superseded estimate; a reported row's own cost, or
for a reported row without one the price book's price at its event time; an estimate is
never priced (its tokens are "at risk"). A ``run_total`` row never counts.

Each usage row of a batch becomes one ``SpendRow``, owned as billing owns it (tenant,
account, model from the usage row; user and agent from the run's record in the same
batch), identified by its ``event_id`` and ``version``: the core writes every change of a
row (a retraction, a superseded estimate, a re-stated owner) again with a higher version,
and at most one counted row per (run, turn, attempt) (rule 12), so the desk keeps the
latest version of each and a re-delivered or re-stepped batch changes nothing. A row
that no longer counts is sent as ``kind="none"``: it takes its earlier amount back out.

The price book lives in ClickHouse (``prices_store``); a worker reads it with
``prism.sinks.price_book`` and passes it here as a ``PriceBook``, which prices a row as
the billing SQL does (sinks/_billing.py): uncached input, output, cache reads and cache
writes at the price valid at the row's event time, each term cut to 12 decimals.

The records go to the single-partition ``<prefix>.limit-deaths`` topic beside the limit
deaths and lane reports (one record per owner and batch, at most ``CHUNK`` rows); the
exhaustion alerter's decoder skips them (no ``runId`` or ``lane`` at the top).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from decimal import ROUND_DOWN, Decimal
from typing import Any, Protocol

import orjson

from prism.pipeline.core import LaneReport, Output, OutRecord
from prism.schemas import UsageRow

from ._period import to_us as _us

__all__ = [
    "CHUNK",
    "SPEND_KIND",
    "PriceBook",
    "SpendRow",
    "decode_budget_input",
    "spend_records",
    "spend_rows",
]

SPEND_KIND = "budget_spend"  # the records' "kind"
CHUNK = 500  # rows per record, so a record stays far below Kafka's 1 MB default
_CUT = Decimal("1e-12")


@dataclass(frozen=True, slots=True)
class SpendRow:
    """One usage row as the desk counts it.

    ``kind``: ``reported`` (``cost`` in ``currency``, or both None: unpriced),
    ``estimated`` (tokens at risk, never priced) or ``none`` (no longer counts: retracted,
    superseded, or not billable). ``priced_by``: ``runtime``, ``price_book`` or
    ``unpriced``, as billing says.
    """

    event_id: str
    run_id: str
    turn: int | None
    attempt: int | None
    version: int
    ts_us: int
    kind: str
    tenant: str | None = None
    account: str | None = None
    user: str | None = None
    agent: str | None = None
    model: str | None = None
    cost: Decimal | None = None
    currency: str | None = None
    priced_by: str = "unpriced"
    input_tokens: int = 0
    output_tokens: int = 0

    def owner(self) -> dict[str, str | None]:
        """The row's scope dimensions (``BudgetScope.matches`` reads them)."""
        return {
            "tenant": self.tenant,
            "account": self.account,
            "user": self.user,
            "agent": self.agent,
            "model": self.model,
        }

    def to_list(self) -> list[Any]:
        return [
            self.event_id, self.run_id, self.turn, self.attempt, self.version, self.ts_us,
            self.kind, self.tenant, self.account, self.user, self.agent, self.model,
            None if self.cost is None else str(self.cost), self.currency, self.priced_by,
            self.input_tokens, self.output_tokens,
        ]  # fmt: skip

    @classmethod
    def from_list(cls, v: list[Any]) -> SpendRow:
        return cls(
            v[0], v[1], v[2], v[3], int(v[4]), int(v[5]), v[6], v[7], v[8], v[9], v[10], v[11],
            None if v[12] is None else Decimal(v[12]), v[13], v[14], int(v[15]), int(v[16]),
        )  # fmt: skip


class _Price(Protocol):
    provider: str
    model: str
    token_kind: str
    currency: str
    valid_from: datetime
    unit_price: Decimal
    per_tokens: int


class PriceBook:
    """The price book (``prism.sinks.price_book`` rows) as billing applies it to a reported
    row without a cost.

    Example::

        book = PriceBook(price_book(client, "prism"))
        book.price(row)   # (Decimal("0.0042"), "USD"), or None when the book cannot price it
    """

    def __init__(self, prices: Iterable[_Price]) -> None:
        # (provider, model, currency) -> token kind -> sorted [(valid_from us, price, per)]
        self._book: dict[tuple[str, str, str], dict[str, list[tuple[int, Decimal, int]]]] = {}
        for p in prices:
            kinds = self._book.setdefault((p.provider, p.model, p.currency), {})
            kinds.setdefault(p.token_kind, []).append(
                (_us(p.valid_from), Decimal(p.unit_price), int(p.per_tokens))
            )
        for kinds in self._book.values():
            for lst in kinds.values():
                lst.sort()

    def price(self, row: UsageRow) -> tuple[Decimal, str] | None:
        """The book's cost and currency of a reported row at its event time, or None."""
        provider, model = row.provider or "", row.model or ""
        currency = row.currency
        if currency is None:  # the book's, when it prices the model in one currency only
            found = [c for (p, m, c) in self._book if p == provider and m == model]
            if len(found) != 1:
                return None
            currency = found[0]
        kinds = self._book.get((provider, model, currency))
        if kinds is None or (row.input_tokens is None and row.output_tokens is None):
            return None
        cache_read, cache_write = row.cache_read_tokens or 0, row.cache_write_tokens or 0
        counts = {
            "input": max((row.input_tokens or 0) - cache_read - cache_write, 0),
            "output": row.output_tokens or 0,
            "cache_read": cache_read,
            "cache_write": cache_write,
        }
        at = _us(row.recorded_at)
        total = Decimal(0)
        for kind, n in counts.items():
            if n == 0:
                continue
            valid = [p for p in kinds.get(kind, ()) if p[0] <= at]
            if not valid:
                return None
            _, unit, per = valid[-1]
            total += (Decimal(n) * unit / Decimal(per)).quantize(_CUT, rounding=ROUND_DOWN)
        return total, currency


def spend_rows(out: Output, prices: PriceBook | None = None) -> list[SpendRow]:
    """The ``SpendRow`` of each ``provider_turn`` usage row of a step's output."""
    runs = {r.run_id: r for r in out.ledger.runs}  # the last record of each run wins
    rows = []
    for u in out.ledger.usage:
        if u.scope != "provider_turn":
            continue
        run = runs.get(u.run_id)
        kind = "none"
        cost, currency, priced_by = None, None, "unpriced"
        if not u.retracted and not u.superseded:
            kind = "estimated" if u.estimated else "reported"
        if kind == "reported":
            if u.cost is not None:
                cost, currency, priced_by = u.cost, u.currency, "runtime"
            elif prices is not None and (priced := prices.price(u)) is not None:
                (cost, currency), priced_by = priced, "price_book"
        rows.append(
            SpendRow(
                event_id=u.event_id,
                run_id=u.run_id,
                turn=u.turn,
                attempt=u.attempt,
                version=u.version,
                ts_us=_us(u.recorded_at),
                kind=kind,
                tenant=u.tenant_id,
                account=u.account_id,
                user=run.user_id if run is not None else None,
                agent=run.agent_id if run is not None else None,
                model=u.model,
                cost=cost,
                currency=currency,
                priced_by=priced_by,
                input_tokens=u.input_tokens or 0,
                output_tokens=u.output_tokens or 0,
            )
        )
    return rows


def spend_records(out: Output, prices: PriceBook | None = None) -> list[OutRecord]:
    """The ``limit-deaths`` records of a step's spend: one per tenant, ``CHUNK`` rows each.

    Produce them in the step's transaction, before the lane's ``lane_record`` of the
    same step (a report says the lane sent everything up to its mark).
    """
    by_tenant: dict[str, list[SpendRow]] = defaultdict(list)
    for row in spend_rows(out, prices):
        by_tenant[row.tenant or ""].append(row)
    records = []
    for tenant in sorted(by_tenant):
        rows = by_tenant[tenant]
        for i in range(0, len(rows), CHUNK):
            value = {"kind": SPEND_KIND, "rows": [r.to_list() for r in rows[i : i + CHUNK]]}
            records.append(OutRecord(key=f"spend:{tenant}".encode(), value=orjson.dumps(value)))
    return records


def decode_budget_input(
    values: Iterable[bytes | None],
) -> tuple[list[SpendRow], dict[int, LaneReport]]:
    """The spend rows (in order) and each lane's latest report in a batch of
    ``limit-deaths`` record values (limit deaths are skipped)."""
    rows: list[SpendRow] = []
    reports: dict[int, LaneReport] = {}
    for raw in values:
        d = orjson.loads(raw or b"{}")
        if not isinstance(d, dict):
            continue
        if d.get("kind") == SPEND_KIND:
            rows.extend(SpendRow.from_list(v) for v in d["rows"])
        elif "lane" in d:
            hold = d.get("hold")  # copies on their way to a lane held elsewhere
            reports[int(d["lane"])] = LaneReport(
                int(d["mark"]),
                d["pending"],
                bool(d["idle"]),
                bool(d["quiet"]),
                None if hold is None else int(hold),
            )
    return rows, reports
