"""Invoice lines per tenant and month, reconciled with the ledger.

An invoice line is one tenant's reported ``provider_turn`` usage in one month for one
provider, model, currency and pricing source (``runtime``, ``price_book``, ``unpriced``),
with its event count and cost; estimates are never invoiced (CONTRACT.md rule 6). The
reconciliation recounts the month from the ``billing_usage`` view, a query independent of
the billing report's: per tenant, the events the lines hold must equal the billable events
of the ledger, and per tenant and currency the runtime-priced cost of the lines must equal
the ledger's sum of reported costs.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from clickhouse_connect.driver.client import Client

from prism.sinks._billing import billing_report
from prism.sinks._client import validate_identifier
from prism.sinks._errors import LedgerConfigError, LedgerQueryError

__all__ = [
    "INVOICE_GROUP_BY",
    "Invoice",
    "InvoiceLine",
    "Reconciliation",
    "invoice",
    "month_bounds",
    "resolve_month",
]

INVOICE_GROUP_BY = ("tenant", "month", "provider", "model")
_MONTH_RE = re.compile(r"^(\d{4})-(\d{2})$")


@dataclass(frozen=True, slots=True)
class InvoiceLine:
    """One invoice line; ``cost`` is NULL for ``unpriced`` lines (no reported cost, no price)."""

    tenant_id: str | None
    month: str
    provider: str | None
    model: str | None
    currency: str | None
    priced_by: str
    event_count: int
    input_tokens: int | None
    output_tokens: int | None
    total_tokens: int | None
    cache_read_tokens: int | None
    cache_write_tokens: int | None
    cost: Decimal | None


@dataclass(frozen=True, slots=True)
class Reconciliation:
    """One figure of one tenant's month: the ledger's count or sum against the lines'."""

    tenant_id: str | None
    month: str
    figure: str  # "events" or "runtime_cost"
    currency: str | None
    ledger: int | Decimal
    invoice: int | Decimal

    @property
    def ok(self) -> bool:
        return self.ledger == self.invoice


@dataclass(frozen=True, slots=True)
class Invoice:
    """The invoice lines of a month and their reconciliation with the ledger."""

    month: str
    lines: list[InvoiceLine]
    reconciliation: list[Reconciliation] = field(default_factory=list)

    @property
    def balanced(self) -> bool:
        return all(r.ok for r in self.reconciliation)


def month_bounds(month: str) -> tuple[date, date]:
    """``'2026-11'`` -> (2026-11-01, 2026-12-01): the month as a half-open period."""
    match = _MONTH_RE.match(month)
    if not match or not 1 <= int(match[2]) <= 12:
        raise LedgerConfigError(f"month {month!r} is not YYYY-MM (e.g. 2026-11)")
    year, mon = int(match[1]), int(match[2])
    first = date(year, mon, 1)
    return first, date(year + mon // 12, mon % 12 + 1, 1)


def resolve_month(text: str, today: date | datetime | None = None) -> str:
    """``YYYY-MM``, ``this`` or ``last`` (relative to ``today``, UTC) as ``YYYY-MM``."""
    day = today or datetime.now(UTC)
    word = text.strip().lower()
    if word == "this":
        return f"{day.year:04d}-{day.month:02d}"
    if word == "last":
        year, month = (day.year, day.month - 1) if day.month > 1 else (day.year - 1, 12)
        return f"{year:04d}-{month:02d}"
    try:
        month_bounds(text)
    except LedgerConfigError:
        raise LedgerConfigError(
            f"month {text!r} is not YYYY-MM (e.g. 2026-11), this or last"
        ) from None
    return text


def invoice(client: Client, database: str, month: str, tenant: str | None = None) -> Invoice:
    """The invoice lines of ``month`` (YYYY-MM), per tenant, reconciled with the ledger.

    Example::

        inv = invoice(client, "prism", "2026-11", tenant="acme")
        assert inv.balanced
        sum(line.event_count for line in inv.lines)
    """
    validate_identifier(database)
    start, end = month_bounds(month)
    lines = [
        InvoiceLine(
            tenant_id=line.tenant_id,
            month=line.month or month,
            provider=line.provider,
            model=line.model,
            currency=line.currency,
            priced_by=line.priced_by,
            event_count=line.rows,
            input_tokens=line.input_tokens,
            output_tokens=line.output_tokens,
            total_tokens=line.total_tokens,
            cache_read_tokens=line.cache_read_tokens,
            cache_write_tokens=line.cache_write_tokens,
            cost=line.cost,
        )
        for line in billing_report(client, database, start, end, tenant, group_by=INVOICE_GROUP_BY)
        if line.kind == "reported"
    ]
    return Invoice(month, lines, _reconcile(client, database, month, start, end, tenant, lines))


def _reconcile(
    client: Client,
    database: str,
    month: str,
    start: date,
    end: date,
    tenant: str | None,
    lines: list[InvoiceLine],
) -> list[Reconciliation]:
    where = (
        "NOT estimated AND recorded_at >= {start:DateTime64(3, 'UTC')} "
        "AND recorded_at < {end:DateTime64(3, 'UTC')}"
        + (" AND tenant_id = {tenant:String}" if tenant is not None else "")
    )
    params: dict[str, Any] = {"start": f"{start} 00:00:00.000", "end": f"{end} 00:00:00.000"}
    if tenant is not None:
        params["tenant"] = tenant
    try:
        events = client.query(
            f"SELECT tenant_id, count() FROM {database}.billing_usage WHERE {where} "
            "GROUP BY tenant_id",
            parameters=params,
        ).result_rows
        costs = client.query(
            f"SELECT tenant_id, currency, sum(cost) FROM {database}.billing_usage "
            f"WHERE {where} AND cost IS NOT NULL GROUP BY tenant_id, currency",
            parameters=params,
        ).result_rows
    except Exception as exc:
        raise LedgerQueryError(f"invoice reconciliation on {database!r} failed: {exc}") from exc
    line_events: dict[str | None, int] = defaultdict(int)
    line_costs: dict[tuple[str | None, str | None], Decimal] = defaultdict(Decimal)
    for line in lines:
        line_events[line.tenant_id] += line.event_count
        if line.priced_by == "runtime" and line.cost is not None:
            line_costs[(line.tenant_id, line.currency)] += line.cost
    ledger_events = {t: int(n) for t, n in events}
    ledger_costs = {(t, c): Decimal(v) for t, c, v in costs}
    out = [
        Reconciliation(t, month, "events", None, ledger_events.get(t, 0), line_events.get(t, 0))
        for t in sorted(set(ledger_events) | set(line_events), key=lambda t: t or "")
    ]
    out += [
        Reconciliation(
            t, month, "runtime_cost", c, ledger_costs.get((t, c), Decimal(0)),
            line_costs.get((t, c), Decimal(0)),
        )
        for t, c in sorted(set(ledger_costs) | set(line_costs), key=_by_text)
    ]  # fmt: skip
    return out


def _by_text(key: tuple[str | None, str | None]) -> tuple[str, str]:
    return (key[0] or "", key[1] or "")
