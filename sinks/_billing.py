"""The billing report: billable ``provider_turn`` usage grouped as the billing team asks.

Reported usage is summed with its cost per currency; estimates are summed per confidence
and never priced; an estimate superseded by a reported row for the same (run, turn,
attempt) is left out; ``run_total`` rows never reach a total; retracted rows never count
(CONTRACT.md rules 5, 6 and 10). A reported row that arrived without a cost is priced with
the price book (``sinks._prices``) at its event time when the book covers it. Each line
says who priced it: ``runtime``, ``price_book`` or ``unpriced``. sinks/BILLING.md has the SQL.

Whole days of a month whose usage is unchanged since its rollup was refreshed are summed
from that rollup (``sinks._rollup``: the same query's lines per day), the rest from rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from datetime import UTC, date, datetime, time
from decimal import Decimal
from typing import Any

from clickhouse_connect.driver.client import Client

from prism.sinks._client import validate_identifier
from prism.sinks._errors import LedgerConfigError, LedgerQueryError
from prism.sinks._rollup import EXACT, ROLLUP_DIMENSIONS, TOKENS, groupable, rollup_report
from prism.sinks._rollup import refresh_billing_rollup as _refresh_rollup

__all__ = [
    "BILLING_SQL",
    "DEFAULT_GROUP_BY",
    "DIMENSIONS",
    "BillingLine",
    "BillingTotal",
    "billing_report",
    "billing_sql",
    "billing_totals",
    "line_columns",
    "refresh_billing_rollup",
    "to_utc",
]

# --group-by name -> (output column, expression over u = usage rows, r = the run's record).
DIMENSIONS: dict[str, tuple[str, str]] = {
    "tenant": ("tenant_id", "u.tenant_id"),
    "account": ("account_id", "u.account_id"),
    "user": ("user_id", "r.user_id"),
    "agent": ("agent_id", "r.agent_id"),
    "provider": ("provider", "u.provider"),
    "model": ("model", "u.model"),
    "day": ("day", "toDate(u.recorded_at)"),
    "month": ("month", "formatDateTime(u.recorded_at, '%Y-%m')"),
}
DEFAULT_GROUP_BY = ("tenant", "provider", "model")

# {dims} are the grouped columns ("d1, d2, "), {dim_exprs} the same as "expr AS d1, ...",
# {runs_join} the join to the run records (user, agent) or nothing, {tenant_filter} empty
# or the one-tenant condition. The price of a token kind valid at a row's event time is the
# last (valid_from, unit_price, per_tokens) of its sorted list with valid_from <= that time.
_SQL = """
WITH
    book AS (
        SELECT provider, model, currency,
            arraySort(p -> p.1, groupArrayIf((valid_from, unit_price, per_tokens),
                                             token_kind = 'input')) AS input_p,
            arraySort(p -> p.1, groupArrayIf((valid_from, unit_price, per_tokens),
                                             token_kind = 'output')) AS output_p,
            arraySort(p -> p.1, groupArrayIf((valid_from, unit_price, per_tokens),
                                             token_kind = 'cache_read')) AS cache_read_p,
            arraySort(p -> p.1, groupArrayIf((valid_from, unit_price, per_tokens),
                                             token_kind = 'cache_write')) AS cache_write_p
        FROM {db}.prices
        GROUP BY provider, model, currency
    ),
    -- the currency of a row that names none: the book's, when it prices the model in one
    only_currency AS (
        SELECT provider, model, any(currency) AS currency
        FROM book GROUP BY provider, model HAVING count() = 1
    ),
    usage_rows AS (
        SELECT
            {dim_exprs}
            u.recorded_at AS recorded_at,
            u.estimated AS estimated,
            u.confidence AS row_confidence,
            u.cost AS row_cost,
            u.currency AS row_currency,
            ifNull(u.provider, '') AS p_provider,
            ifNull(u.model, '') AS p_model,
            if(u.currency IS NULL, o.currency, assumeNotNull(u.currency)) AS p_currency,
            NOT u.estimated AND u.cost IS NULL AS needs_price,
            u.input_tokens AS input_tokens,
            u.output_tokens AS output_tokens,
            u.total_tokens AS total_tokens,
            u.cache_read_tokens AS cache_read_tokens,
            u.cache_write_tokens AS cache_write_tokens
        FROM {db}.usage_store AS u FINAL{runs_join}
        LEFT JOIN only_currency AS o
            ON o.provider = ifNull(u.provider, '') AND o.model = ifNull(u.model, '')
        WHERE u.scope = 'provider_turn'
          AND u.recorded_at >= {{start:DateTime64(3, 'UTC')}}
          AND u.recorded_at < {{end:DateTime64(3, 'UTC')}}{tenant_filter}
          AND NOT u.superseded
          AND NOT u.retracted
    ),
    priced AS (
        SELECT x.*,
            -- input tokens neither read from nor written to the cache (input counts both)
            greatest(ifNull(x.input_tokens, 0) - ifNull(x.cache_read_tokens, 0)
                     - ifNull(x.cache_write_tokens, 0), 0) AS n_input,
            ifNull(x.output_tokens, 0) AS n_output,
            ifNull(x.cache_read_tokens, 0) AS n_cache_read,
            ifNull(x.cache_write_tokens, 0) AS n_cache_write,
            arrayLast(p -> p.1 <= x.recorded_at, b.input_p) AS pr_input,
            arrayLast(p -> p.1 <= x.recorded_at, b.output_p) AS pr_output,
            arrayLast(p -> p.1 <= x.recorded_at, b.cache_read_p) AS pr_cache_read,
            arrayLast(p -> p.1 <= x.recorded_at, b.cache_write_p) AS pr_cache_write,
            x.needs_price AND b.currency != ''
                AND (x.input_tokens IS NOT NULL OR x.output_tokens IS NOT NULL)
                AND (n_input = 0 OR arrayExists(p -> p.1 <= x.recorded_at, b.input_p))
                AND (n_output = 0 OR arrayExists(p -> p.1 <= x.recorded_at, b.output_p))
                AND (n_cache_read = 0
                     OR arrayExists(p -> p.1 <= x.recorded_at, b.cache_read_p))
                AND (n_cache_write = 0
                     OR arrayExists(p -> p.1 <= x.recorded_at, b.cache_write_p)) AS by_book,
            if(n_input = 0, toDecimal128(0, 12),
               toDecimal128(n_input, 0) * pr_input.2 / pr_input.3)
            + if(n_output = 0, toDecimal128(0, 12),
                 toDecimal128(n_output, 0) * pr_output.2 / pr_output.3)
            + if(n_cache_read = 0, toDecimal128(0, 12),
                 toDecimal128(n_cache_read, 0) * pr_cache_read.2 / pr_cache_read.3)
            + if(n_cache_write = 0, toDecimal128(0, 12),
                 toDecimal128(n_cache_write, 0) * pr_cache_write.2 / pr_cache_write.3)
                AS book_cost
        FROM usage_rows AS x
        LEFT JOIN book AS b  -- only the rows that need a price carry the price lists
            ON b.provider = if(x.needs_price, x.p_provider, '') AND b.model = x.p_model
            AND b.currency = x.p_currency
    )
SELECT
    {dims}
    if(estimated, 'estimated', 'reported') AS kind,
    multiIf(estimated, NULL, row_cost IS NOT NULL, row_currency, by_book,
            toNullable(p_currency), row_currency) AS currency,
    if(estimated, row_confidence, NULL) AS confidence,
    multiIf(estimated, 'unpriced', row_cost IS NOT NULL, 'runtime', by_book, 'price_book',
            'unpriced') AS priced_by,
    count() AS rows,
    sum(input_tokens) AS input_tokens,
    sum(output_tokens) AS output_tokens,
    sum(total_tokens) AS total_tokens,
    sum(cache_read_tokens) AS cache_read_tokens,
    sum(cache_write_tokens) AS cache_write_tokens,
    if(kind = 'estimated', NULL,
       sum(multiIf(row_cost IS NOT NULL, row_cost, by_book, toNullable(book_cost), NULL)))
        AS cost
FROM priced
GROUP BY {dims} kind, currency, confidence, priced_by
ORDER BY {dims} kind, currency, confidence, priced_by
SETTINGS
    join_use_nulls = 0,  -- an unmatched price book row reads as empty lists and ''
    -- an event_id never changes partition, so FINAL may work per partition
    do_not_merge_across_partitions_select_final = 1,
    -- superseded and retracted change between a row's versions: keep them after FINAL
    optimize_move_to_prewhere_if_final = 0
"""

# The same report while the price book is empty: no row can be priced by it, so nothing
# joins the book (the common case stays as fast as a plain aggregate).
_SQL_RUNTIME = """
SELECT
    {dim_exprs}
    if(u.estimated, 'estimated', 'reported') AS kind,
    if(u.estimated, NULL, u.currency) AS currency,
    if(u.estimated, u.confidence, NULL) AS confidence,
    if(u.estimated OR u.cost IS NULL, 'unpriced', 'runtime') AS priced_by,
    count() AS rows,
    sum(u.input_tokens) AS input_tokens,
    sum(u.output_tokens) AS output_tokens,
    sum(u.total_tokens) AS total_tokens,
    sum(u.cache_read_tokens) AS cache_read_tokens,
    sum(u.cache_write_tokens) AS cache_write_tokens,
    if(kind = 'estimated', NULL, sum(u.cost)) AS cost
FROM {db}.usage_store AS u FINAL{runs_join}
WHERE u.scope = 'provider_turn'
  AND u.recorded_at >= {{start:DateTime64(3, 'UTC')}}
  AND u.recorded_at < {{end:DateTime64(3, 'UTC')}}{tenant_filter}
  AND NOT u.superseded
  AND NOT u.retracted
GROUP BY {dims} kind, currency, confidence, priced_by
ORDER BY {dims} kind, currency, confidence, priced_by
SETTINGS
    do_not_merge_across_partitions_select_final = 1,
    optimize_move_to_prewhere_if_final = 0
"""

_RUNS_JOIN = """
        LEFT JOIN (SELECT run_id, user_id, agent_id FROM {db}.runs_store FINAL) AS r
            ON r.run_id = u.run_id"""
_TENANT_FILTER = "\n          AND u.tenant_id = {tenant:String}"


def billing_sql(
    database: str,
    group_by: Sequence[str] = DEFAULT_GROUP_BY,
    *,
    tenant: bool = False,
    price_book: bool = True,
) -> str:
    """The report's SQL for ``group_by`` (names of ``DIMENSIONS``), parameters ``start``/``end``.

    ``price_book=False`` is the same report for a ledger whose price book is empty.
    """
    validate_identifier(database)
    dims = _check_group_by(group_by)
    columns = [DIMENSIONS[d] for d in dims]
    needs_run = any(expr.startswith("r.") for _, expr in columns)
    indent = "            " if price_book else "    "
    return (_SQL if price_book else _SQL_RUNTIME).format(
        db=database,
        dims="".join(f"{name}, " for name, _ in columns),
        dim_exprs="".join(f"{expr} AS {name},\n{indent}" for name, expr in columns),
        runs_join=_RUNS_JOIN.format(db=database) if needs_run else "",
        tenant_filter=_TENANT_FILTER if tenant else "",
    )


@dataclass(frozen=True, slots=True)
class BillingLine:
    """One line of the billing report.

    The dimension fields (``tenant_id`` ... ``month``) hold the line's group; those not in
    ``group_by`` are ``None``. ``kind`` is ``reported`` or ``estimated`` (``confidence``
    set, never priced). ``priced_by`` says where ``cost`` comes from: ``runtime`` (the
    reported cost), ``price_book`` (the book's price at each row's event time) or
    ``unpriced`` (``cost`` NULL). Token totals are ``None`` when no row of the line
    reported that count (absent is not zero).
    """

    kind: str
    currency: str | None
    confidence: str | None
    priced_by: str
    rows: int
    input_tokens: int | None
    output_tokens: int | None
    total_tokens: int | None
    cache_read_tokens: int | None
    cache_write_tokens: int | None
    cost: Decimal | None
    group_by: tuple[str, ...] = DEFAULT_GROUP_BY
    tenant_id: str | None = None
    account_id: str | None = None
    user_id: str | None = None
    agent_id: str | None = None
    provider: str | None = None
    model: str | None = None
    day: date | None = None
    month: str | None = None

    def columns(self) -> list[str]:
        """The printed columns: the grouped dimensions, then the figures."""
        return line_columns(self.group_by)

    def values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self.columns())

    def as_dict(self) -> dict[str, Any]:
        return dict(zip(self.columns(), self.values(), strict=True))


_FIGURES = tuple(f.name for f in fields(BillingLine))[:11]


def line_columns(group_by: Sequence[str]) -> list[str]:
    """The columns of a report grouped by ``group_by``."""
    return [DIMENSIONS[d][0] for d in group_by] + list(_FIGURES)


@dataclass(frozen=True, slots=True)
class BillingTotal:
    """Totals of one kind and currency: rows by who priced them, tokens, and the priced cost."""

    kind: str
    currency: str | None
    rows: int
    runtime_rows: int
    price_book_rows: int
    unpriced_rows: int
    input_tokens: int | None
    output_tokens: int | None
    total_tokens: int | None
    cache_read_tokens: int | None
    cache_write_tokens: int | None
    cost: Decimal | None


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
    *,
    group_by: Sequence[str] = DEFAULT_GROUP_BY,
    rollup: bool = True,
) -> list[BillingLine]:
    """Billable usage recorded in ``[start, end)`` (UTC), grouped by ``group_by``.

    ``rollup=False`` reads every row (``FINAL``), never the day rollup: the reference the
    rollup is tested against. With it, a past month whose rollup is stale is refreshed when
    the client may insert; the lines are the same either way.

    Example::

        lines = billing_report(client, "prism", date(2025, 1, 1), date(2025, 2, 1),
                               group_by=("agent", "month"))
        [(line.agent_id, line.month, line.currency, line.priced_by, line.cost) for line in lines]
    """
    lo, hi = to_utc(start), to_utc(end)
    if lo >= hi:
        raise LedgerConfigError(
            f"billing period is empty: from {lo.isoformat()} is not before to {hi.isoformat()}"
            " (the period is [from, to), to is exclusive)"
        )
    dims = _check_group_by(group_by)
    validate_identifier(database)
    params: dict[str, Any] = {"start": _ch_time(lo), "end": _ch_time(hi)}
    if tenant is not None:
        params["tenant"] = tenant
    try:
        book = client.query(f"SELECT count() FROM {database}.prices_store").result_rows[0][0]
        sql = billing_sql(database, dims, tenant=tenant is not None, price_book=bool(book))
        rows = None
        if rollup and groupable(dims):
            rows = rollup_report(
                client,
                database,
                dims,
                [DIMENSIONS[d][0] for d in dims],
                (sql, params),
                price_book=bool(book),
                refresh_sql=_rollup_source(database),
                refresh_before=datetime.now(UTC).date(),
            )
        if rows is None:
            rows = list(client.query(sql, parameters=params).named_results())
    except Exception as exc:
        raise LedgerQueryError(
            f"billing query on {database!r} failed: {exc}; run `prism-pipeline migrate` if "
            "the ledger tables (usage_store, prices) are missing"
        ) from exc
    return [BillingLine(group_by=dims, **row) for row in rows]


def refresh_billing_rollup(
    client: Client, database: str, months: Iterable[str] | None = None
) -> list[str]:
    """Refresh the day rollup of ``months`` (``YYYYMM``, default all) that are stale.

    Returns the months refreshed; a month written to while it was read is left stale.

    Example::

        refresh_billing_rollup(client, "prism", ["202501"])   # ["202501"], then []
    """
    validate_identifier(database)
    return _refresh_rollup(client, database, _rollup_source(database), months)


def _rollup_source(database: str) -> str:
    """The query a rollup refresh runs: the report per day, tenant, account, provider, model."""
    return billing_sql(database, ROLLUP_DIMENSIONS, price_book=False)


def billing_totals(lines: Iterable[BillingLine]) -> list[BillingTotal]:
    """Per kind and currency: rows (by who priced them), token sums and the priced cost."""
    acc: dict[tuple[str, str | None], dict[str, Any]] = {}
    for line in lines:
        t = acc.setdefault(
            (line.kind, line.currency),
            {"rows": 0, "runtime_rows": 0, "price_book_rows": 0, "unpriced_rows": 0,
             "cost": None, **dict.fromkeys(TOKENS)},
        )  # fmt: skip
        t["rows"] += line.rows
        t[f"{line.priced_by}_rows"] += line.rows
        for name in TOKENS:
            value = getattr(line, name)
            if value is not None:
                t[name] = (t[name] or 0) + value
        if line.cost is not None:
            t["cost"] = EXACT.add(t["cost"] or Decimal(0), line.cost)
    order = sorted(acc, key=lambda k: (k[0] != "reported", k[0], k[1] is None, k[1] or ""))
    return [BillingTotal(kind=k[0], currency=k[1], **acc[k]) for k in order]


def _check_group_by(group_by: Sequence[str]) -> tuple[str, ...]:
    dims = tuple(group_by)
    unknown = [d for d in dims if d not in DIMENSIONS]
    if unknown:
        raise LedgerConfigError(
            f"cannot group billing by {', '.join(map(repr, unknown))}; choose from "
            f"{', '.join(DIMENSIONS)}"
        )
    if len(set(dims)) != len(dims):
        raise LedgerConfigError(f"group-by {','.join(dims)} names a dimension twice")
    return dims


BILLING_SQL = billing_sql("prism")  # the default report on the default database


def _ch_time(value: datetime) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
