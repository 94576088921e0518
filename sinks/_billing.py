"""The billing report: billable ``provider_turn`` usage per tenant, provider, model and currency.

Reported usage is summed with its cost per currency; estimates are summed per confidence
and never priced; an estimate superseded by a reported row for the same (run, turn,
attempt) is left out; ``run_total`` rows never reach a total (CONTRACT.md rules 5 and 6).
The same SQL is documented in ``sinks/BILLING.md``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, date, datetime, time
from decimal import Decimal
from typing import Any

from clickhouse_connect.driver.client import Client

from prism.sinks._client import validate_identifier
from prism.sinks._errors import LedgerConfigError, LedgerQueryError

__all__ = ["BILLING_SQL", "BillingLine", "billing_report", "to_utc"]

# {db} is the ledger database; {tenant_filter} is empty, or the one-tenant condition.
BILLING_SQL = """
SELECT
    u.tenant_id AS tenant_id,
    u.provider AS provider,
    u.model AS model,
    if(u.estimated, 'estimated', 'reported') AS kind,
    if(u.estimated, NULL, u.currency) AS currency,
    if(u.estimated, u.confidence, NULL) AS confidence,
    count() AS rows,
    sum(u.input_tokens) AS input_tokens,
    sum(u.output_tokens) AS output_tokens,
    sum(u.total_tokens) AS total_tokens,
    sum(u.cache_read_tokens) AS cache_read_tokens,
    sum(u.cache_write_tokens) AS cache_write_tokens,
    if(kind = 'estimated', NULL, sum(u.cost)) AS cost
FROM {db}.usage_store AS u FINAL
WHERE u.scope = 'provider_turn'
  AND u.recorded_at >= {{start:DateTime64(3, 'UTC')}}
  AND u.recorded_at < {{end:DateTime64(3, 'UTC')}}{tenant_filter}
  AND NOT u.superseded
GROUP BY tenant_id, provider, model, kind, currency, confidence
ORDER BY tenant_id, provider, model, kind, currency, confidence
SETTINGS
    -- an event_id never changes partition, so FINAL may work per partition
    do_not_merge_across_partitions_select_final = 1,
    -- the filters are on columns a row's versions share (scope, time, tenant), but
    -- superseded changes between versions: keep it after FINAL
    optimize_move_to_prewhere_if_final = 0
"""

_TENANT_FILTER = "\n  AND u.tenant_id = {tenant:String}"


@dataclass(frozen=True, slots=True)
class BillingLine:
    """One line of the billing report.

    ``kind`` is ``reported`` (priced in ``currency``; ``cost`` is NULL when no row of the
    line carried one) or ``estimated`` (``confidence`` set, never priced). Token totals are
    ``None`` when no row of the line reported that count (absent is not zero).
    """

    tenant_id: str | None
    provider: str | None
    model: str | None
    kind: str
    currency: str | None
    confidence: str | None
    rows: int
    input_tokens: int | None
    output_tokens: int | None
    total_tokens: int | None
    cache_read_tokens: int | None
    cache_write_tokens: int | None
    cost: Decimal | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def to_utc(value: datetime | date) -> datetime:
    """An aware UTC datetime; a date is its midnight UTC, a naive datetime is taken as UTC."""
    if not isinstance(value, datetime):
        return datetime.combine(value, time(0), tzinfo=UTC)
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def billing_report(
    client: Client,
    database: str,
    start: datetime | date,
    end: datetime | date,
    tenant: str | None = None,
) -> list[BillingLine]:
    """Billable usage recorded in ``[start, end)`` (UTC), optionally for one tenant.

    Example::

        lines = billing_report(client, "prism", date(2025, 1, 1), date(2025, 2, 1))
        [(line.tenant_id, line.kind, line.currency, line.cost) for line in lines]
    """
    validate_identifier(database)
    lo, hi = to_utc(start), to_utc(end)
    if lo >= hi:
        raise LedgerConfigError(
            f"billing period is empty: from {lo.isoformat()} is not before to {hi.isoformat()}"
            " (the period is [from, to), to is exclusive)"
        )
    sql = BILLING_SQL.format(
        db=database,
        tenant_filter=_TENANT_FILTER if tenant is not None else "",
    )
    params: dict[str, Any] = {"start": _ch_time(lo), "end": _ch_time(hi)}
    if tenant is not None:
        params["tenant"] = tenant
    try:
        result = client.query(sql, parameters=params)
    except Exception as exc:
        raise LedgerQueryError(
            f"billing query on {database!r} failed: {exc}; run `prism-pipeline migrate` if "
            "the ledger tables are missing"
        ) from exc
    return [BillingLine(**row) for row in result.named_results()]


def _ch_time(value: datetime) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
