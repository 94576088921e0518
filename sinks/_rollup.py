"""Billing's day rollup: a month's report lines per day, used while the month's data is unchanged.

A refresh runs the billing report's own query (``FINAL``, retracted and superseded rows left
out, CONTRACT.md rules 5, 6, 10-12) over one ``usage_store`` partition (a calendar month),
grouped by day, tenant, account, provider and model, and keeps those lines with the exact
set of parts it read (``billing_rollup_store``, ``billing_rollup_manifest``, migration
0008). A report sums those lines instead of the rows for the whole days of a month whose
partition still holds the same data. The bill stays a function of the stored rows, because
the lines are one:

- every insert (a new version, a retraction, a re-stated owner, a re-delivered batch the
  deduplication window no longer covers) creates a part with a higher block number, and a
  mutation raises a part's data version: either makes the month's lines unusable;
- a dropped or detached part leaves one of the recorded parts uncovered: unusable too;
- a ReplacingMergeTree merge never changes what ``FINAL`` returns, so merged parts (whose
  block ranges join recorded parts) keep the lines usable.

The lines are never summed from rows the partition no longer holds, and a month that is
not known to be unchanged is read from the rows, as before. A refresh stores nothing when
the partition changed while it read, or when it could not see every row (a row policy).
Non-replicated tables only: a replica may show parts out of block order, so a replicated
ledger reads rows. Block numbers of a non-replicated MergeTree are taken when a part is
committed, under the table's parts lock, so no part with a lower number can appear after a
refresh read the partition.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Context, Decimal
from typing import Any

from clickhouse_connect.driver.client import Client

from prism.sinks._client import validate_identifier

__all__ = [
    "EXACT",
    "ROLLUP_DIMENSIONS",
    "TOKENS",
    "RollupPlan",
    "groupable",
    "merge_lines",
    "plan_rollup",
    "refresh_billing_rollup",
    "rollup_report",
    "rollup_sql",
]

log = logging.getLogger(__name__)

# The report's dimensions a rollup line keeps; "month" is derived from "day".
ROLLUP_DIMENSIONS = ("tenant", "account", "provider", "model", "day")
_GROUPABLE = frozenset((*ROLLUP_DIMENSIONS, "month"))
_ROLLUP_EXPRS = {
    "tenant": ("tenant_id", "r.tenant_id"),
    "account": ("account_id", "r.account_id"),
    "provider": ("provider", "r.provider"),
    "model": ("model", "r.model"),
    "day": ("day", "r.day"),
    "month": ("month", "formatDateTime(r.day, '%Y-%m')"),
}
_LINE_KEY = ("kind", "currency", "confidence", "priced_by")
# Decimal(38, 12) sums, exactly: Python's default context keeps 28 significant digits.
EXACT = Context(prec=80)
# ClickHouse's Date ends on 2149-06-06: toDate() of a later time wraps around (to 1970 and
# on), in the report's "day" and in usage_store's sorting key alike. The rollup covers
# whole months before it; a period that reaches past it reads rows, as the report did.
_DATE_END = datetime(2149, 6, 1, tzinfo=UTC)
TOKENS = (  # a billing line's token columns (sinks._billing sums the same)
    "input_tokens",
    "output_tokens",
    "total_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
)
_ROLLUP_COLUMNS = [
    "month",
    "refresh_id",
    "day",
    "tenant_id",
    "account_id",
    "provider",
    "model",
    *_LINE_KEY,
    "rows",
    *TOKENS,
    "cost",
]
_MANIFEST_COLUMNS = [
    "month",
    "refresh_id",
    "table_uuid",
    "generation",
    "parts",
    "needs_price",
    "created_at",
]
# Explicit: ClickHouse 26 inserts asynchronously by default, and a refresh must know its
# lines are stored before it writes the manifest that makes them readable.
_INSERT_SETTINGS: dict[str, Any] = {
    "async_insert": 0,
    "wait_for_async_insert": 1,
    "insert_deduplicate": 1,
}

_SQL = """
SELECT
    {dim_exprs}
    r.kind AS kind,
    r.currency AS currency,
    r.confidence AS confidence,
    r.priced_by AS priced_by,
    sum(r.rows) AS rows,
    sum(r.input_tokens) AS input_tokens,
    sum(r.output_tokens) AS output_tokens,
    sum(r.total_tokens) AS total_tokens,
    sum(r.cache_read_tokens) AS cache_read_tokens,
    sum(r.cache_write_tokens) AS cache_write_tokens,
    if(kind = 'estimated', NULL, sum(r.cost)) AS cost
FROM {db}.billing_rollup_store AS r
WHERE r.refresh_id IN {{refresh_ids:Array(String)}}
  AND r.day >= {{first_day:Date}}
  AND r.day < {{end_day:Date}}{tenant_filter}
GROUP BY {dims} kind, currency, confidence, priced_by
ORDER BY {dims} kind, currency, confidence, priced_by
"""


def groupable(group_by: Sequence[str]) -> bool:
    """Whether a report grouped by ``group_by`` can be summed from rollup lines."""
    return set(group_by) <= _GROUPABLE


def rollup_sql(database: str, group_by: Sequence[str], *, tenant: bool = False) -> str:
    """The report over rollup lines (parameters ``refresh_ids``, ``first_day``, ``end_day``)."""
    validate_identifier(database)
    columns = [_ROLLUP_EXPRS[d] for d in group_by]
    return _SQL.format(
        db=database,
        dims="".join(f"{name}, " for name, _ in columns),
        dim_exprs="".join(f"{expr} AS {name},\n    " for name, expr in columns),
        tenant_filter="\n  AND r.tenant_id = {tenant:String}" if tenant else "",
    )


@dataclass(frozen=True, slots=True)
class _Part:
    min_block: int
    max_block: int
    data_version: int
    rows: int = 0

    @property
    def generation(self) -> int:
        return max(self.max_block, self.data_version)


@dataclass(frozen=True, slots=True)
class _Table:
    uuid: str
    engine: str  # engine_full
    parts: dict[str, tuple[_Part, ...]]  # partition id (YYYYMM) -> its active parts

    @property
    def usable(self) -> bool:
        """Whether parts say when data changed: not replicated (parts may show out of block
        order), no TTL (a TTL merge deletes rows), only month partitions (no patch parts of
        lightweight updates, which change a month without changing its parts)."""
        return (
            not self.engine.startswith("Replicated")
            and " TTL " not in f" {self.engine} "
            and all(len(pid) == 6 and pid.isdigit() for pid in self.parts)
        )


@dataclass(frozen=True, slots=True)
class _Manifest:
    refresh_id: str
    table_uuid: str
    generation: int
    parts: tuple[tuple[int, int], ...]
    needs_price: bool

    def holds(self, table: _Table, parts: Sequence[_Part]) -> bool:
        """Whether ``parts`` hold exactly the data this refresh read (merged or not)."""
        if table.uuid != self.table_uuid:
            return False
        if any(p.generation > self.generation for p in parts):
            return False  # an insert or a mutation since
        mins = {lo for lo, _ in self.parts}
        maxs = {hi for _, hi in self.parts}
        if any(p.min_block not in mins or p.max_block not in maxs for p in parts):
            return False  # a part that is not a merge of the parts read
        return all(
            any(p.min_block <= lo and hi <= p.max_block for p in parts) for lo, hi in self.parts
        )  # nothing read was dropped


@dataclass(frozen=True, slots=True)
class RollupPlan:
    """How a report reads ``[start, end)``: rollup lines for whole days, rows for the rest."""

    refresh_ids: tuple[str, ...]
    first_day: date
    end_day: date
    row_ranges: tuple[tuple[datetime, datetime], ...]


def plan_rollup(
    client: Client,
    database: str,
    start: datetime,
    end: datetime,
    *,
    price_book: bool,
    refresh_sql: str,
    refresh_before: date | None,
) -> RollupPlan | None:
    """Which months of ``[start, end)`` may be read from rollup lines; None: read rows only.

    A month whose lines are stale is refreshed first when it ends on or before
    ``refresh_before`` (and the caller may insert); ``refresh_sql`` is the report's query
    grouped by ``ROLLUP_DIMENSIONS`` without the price book.
    """
    first_day = (start + timedelta(days=1) - timedelta(microseconds=1)).date()
    end_day = end.date()
    if first_day >= end_day:
        return None
    table = _table(client, database)
    if table is None or not table.usable:
        return None
    if _midnight(end_day) > _DATE_END:
        return None  # see _DATE_END
    months = sorted(
        pid
        for pid in table.parts
        if _month_start(pid) < _midnight(end_day) and _month_end(pid) > _midnight(first_day)
    )
    manifests = _manifests(client, database, months)
    used: list[str] = []
    rows_from: list[tuple[datetime, datetime]] = []
    for pid in months:
        parts = table.parts[pid]
        found = next((m for m in manifests.get(pid, ()) if m.holds(table, parts)), None)
        if (
            found is None
            and refresh_before is not None
            and _month_end(pid).date() <= refresh_before
        ):
            found = _refresh(client, database, pid, table, refresh_sql)
        if found is not None and not (price_book and found.needs_price):
            used.append(found.refresh_id)
        else:
            lo = max(_month_start(pid), _midnight(first_day))
            hi = min(_month_end(pid), _midnight(end_day))
            rows_from.append((lo, hi))
    if start < _midnight(first_day) and _has_month(table, start):
        rows_from.insert(0, (start, _midnight(first_day)))
    if _midnight(end_day) < end and _has_month(table, _midnight(end_day)):
        rows_from.append((_midnight(end_day), end))
    return RollupPlan(tuple(used), first_day, end_day, tuple(_joined(rows_from)))


def refresh_billing_rollup(
    client: Client,
    database: str,
    refresh_sql: str,
    months: Iterable[str] | None = None,
) -> list[str]:
    """Refresh the rollup of ``months`` (``YYYYMM``; default every month with usage) whose
    lines are stale; return the months refreshed. A month written to meanwhile is skipped."""
    table = _table(client, database)
    if table is None or not table.usable:
        return []
    wanted = sorted(
        pid
        for pid in (table.parts if months is None else set(months) & set(table.parts))
        if _month_end(pid) <= _DATE_END
    )
    manifests = _manifests(client, database, wanted)
    done = []
    for pid in wanted:
        if any(m.holds(table, table.parts[pid]) for m in manifests.get(pid, ())):
            continue
        if _refresh(client, database, pid, table, refresh_sql) is not None:
            done.append(pid)
    return done


def rollup_report(
    client: Client,
    database: str,
    group_by: Sequence[str],
    names: Sequence[str],
    rows_query: tuple[str, dict[str, Any]],
    *,
    price_book: bool,
    refresh_sql: str,
    refresh_before: date | None,
) -> list[dict[str, Any]] | None:
    """The report from rollup lines where they are current and rows elsewhere; None: rows.

    ``rows_query`` is the report's own query and parameters (``start``, ``end`` and
    ``tenant``): it reads the periods the rollup does not cover.
    """
    sql, params = rows_query
    start, end = _parse_time(params["start"]), _parse_time(params["end"])
    try:
        plan = plan_rollup(
            client,
            database,
            start,
            end,
            price_book=price_book,
            refresh_sql=refresh_sql,
            refresh_before=refresh_before,
        )
    except Exception as exc:  # a ledger before migration 0008, an account that may not read it
        log.info("billing reads rows: no rollup (%s)", exc)
        return None
    if plan is None or not plan.refresh_ids:
        return None
    tenant = {k: v for k, v in params.items() if k == "tenant"}
    lines = client.query(
        rollup_sql(database, group_by, tenant=bool(tenant)),
        parameters={
            "refresh_ids": list(plan.refresh_ids),
            "first_day": plan.first_day,
            "end_day": plan.end_day,
            **tenant,
        },
    ).named_results()
    results = [list(lines)]
    for lo, hi in plan.row_ranges:
        part = {**params, "start": _ch_time(lo), "end": _ch_time(hi)}
        results.append(list(client.query(sql, parameters=part).named_results()))
    return results[0] if len(results) == 1 else merge_lines(results, names)


def merge_lines(
    results: Iterable[Iterable[dict[str, Any]]], names: Sequence[str]
) -> list[dict[str, Any]]:
    """Sum report lines of disjoint periods by group; order as the report's ORDER BY."""
    key_names = (*names, *_LINE_KEY)
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    for lines in results:
        for line in lines:
            key = tuple(line[k] for k in key_names)
            acc = merged.get(key)
            if acc is None:
                merged[key] = dict(line)
                continue
            acc["rows"] += line["rows"]
            for name in (*TOKENS, "cost"):
                acc[name] = _add(acc[name], line[name])
    # ClickHouse orders NULL last and strings by their bytes (code points for UTF-8)
    return [
        merged[k]
        for k in sorted(merged, key=lambda k: tuple((v is None, v) for v in k))  # type: ignore[no-any-return]
    ]


# -- internals ---------------------------------------------------------------------------


def _add(a: Any, b: Any) -> Any:
    """a + b where None is absent; Decimals exactly (the default context rounds at 28 digits)."""
    if a is None:
        return b
    if b is None:
        return a
    if isinstance(a, Decimal):
        return EXACT.add(a, b)
    return a + b


def _midnight(day: date) -> datetime:
    return datetime.combine(day, time(0), tzinfo=UTC)


def _month_start(pid: str) -> datetime:
    return datetime(int(pid[:4]), int(pid[4:6]), 1, tzinfo=UTC)


def _month_end(pid: str) -> datetime:
    year, month = int(pid[:4]), int(pid[4:6])
    return datetime(year + month // 12, month % 12 + 1, 1, tzinfo=UTC)


def _has_month(table: _Table, when: datetime) -> bool:
    return f"{when.year:04d}{when.month:02d}" in table.parts


def _joined(ranges: list[tuple[datetime, datetime]]) -> list[tuple[datetime, datetime]]:
    out: list[tuple[datetime, datetime]] = []
    for lo, hi in sorted(ranges):
        if out and out[-1][1] >= lo:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _table(client: Client, database: str) -> _Table | None:
    """usage_store's uuid, engine and active parts, or None when it does not exist."""
    rows = client.query(
        "SELECT toString(uuid) AS u, engine_full AS e, '' AS p, toInt64(0) AS lo, "
        "toInt64(0) AS hi, toUInt64(0) AS dv, toUInt64(0) AS n FROM system.tables "
        "WHERE database = {db:String} AND name = 'usage_store' "
        "UNION ALL "
        "SELECT '', '', partition_id, toInt64(min_block_number), toInt64(max_block_number), "
        "toUInt64(data_version), rows "
        "FROM system.parts WHERE database = {db:String} AND table = 'usage_store' AND active",
        parameters={"db": database},
    ).result_rows
    found = [(uuid_, engine) for uuid_, engine, pid, *_ in rows if not pid]
    if not found:
        return None
    parts: dict[str, list[_Part]] = {}
    for _, _, pid, lo, hi, dv, n in rows:
        if pid:
            parts.setdefault(str(pid), []).append(_Part(int(lo), int(hi), int(dv), int(n)))
    return _Table(
        uuid=str(found[0][0]),
        engine=str(found[0][1]),
        parts={pid: tuple(sorted(ps, key=lambda p: p.min_block)) for pid, ps in parts.items()},
    )


def _manifests(client: Client, database: str, months: Sequence[str]) -> dict[str, list[_Manifest]]:
    """Each month's refreshes, newest first."""
    if not months:
        return {}
    rows = client.query(
        f"SELECT month, refresh_id, toString(table_uuid), generation, parts, needs_price "
        f"FROM {database}.billing_rollup_manifest WHERE month IN {{months:Array(String)}} "
        "ORDER BY created_at DESC, refresh_id DESC",
        parameters={"months": list(months)},
    ).result_rows
    out: dict[str, list[_Manifest]] = {}
    for month, refresh_id, table_uuid, generation, parts, needs_price in rows:
        out.setdefault(str(month), []).append(
            _Manifest(
                str(refresh_id),
                str(table_uuid),
                int(generation),
                tuple((int(lo), int(hi)) for lo, hi in parts),
                bool(needs_price),
            )
        )
    return out


def _refresh(
    client: Client, database: str, pid: str, before: _Table, refresh_sql: str
) -> _Manifest | None:
    """Compute month ``pid``'s lines and store them with the parts they came from.

    ``before`` was read before the lines; if the partition's parts differ afterwards, a
    write or a merge ran meanwhile and the lines are not stored (the next report retries).
    Any error (an account that may not insert) leaves the month to be read from rows.
    """
    try:
        result = client.query(
            refresh_sql,
            parameters={
                "start": _ch_time(_month_start(pid)),
                "end": _ch_time(_month_end(pid)),
            },
        )
        lines = list(result.named_results())
        # every row of the month visible: no row policy or additional_table_filters of this
        # account hid some, or lines for all would hold only what it may see
        seen = client.query(
            f"SELECT count() FROM {database}.usage_store WHERE _partition_id = {{pid:String}}",
            parameters={"pid": pid},
        ).result_rows[0][0]
        after = _table(client, database)
        if (
            after is None
            or after.uuid != before.uuid
            or after.parts.get(pid) != before.parts.get(pid)
        ):
            log.info("billing rollup of %s skipped: usage_store changed while it was read", pid)
            return None
        parts = before.parts.get(pid, ())
        if int(seen) != sum(p.rows for p in parts):
            log.info("billing rollup of %s skipped: %d of %d rows visible", pid, int(seen),
                     sum(p.rows for p in parts))  # fmt: skip
            return None
        manifest = _Manifest(
            refresh_id=uuid.uuid4().hex,
            table_uuid=before.uuid,
            generation=max((p.generation for p in parts), default=0),
            parts=tuple((p.min_block, p.max_block) for p in parts),
            needs_price=any(
                line["kind"] == "reported" and line["priced_by"] == "unpriced" for line in lines
            ),
        )
        _insert(
            client,
            database,
            "billing_rollup_store",
            [[pid, manifest.refresh_id, *(line[c] for c in _ROLLUP_COLUMNS[2:])] for line in lines],
            _ROLLUP_COLUMNS,
            manifest.refresh_id,
        )
        row = [pid, manifest.refresh_id, manifest.table_uuid, manifest.generation]
        row += [list(manifest.parts), manifest.needs_price, datetime.now(UTC)]
        _insert(
            client,
            database,
            "billing_rollup_manifest",
            [row],
            _MANIFEST_COLUMNS,
            manifest.refresh_id,
        )
    except Exception as exc:  # the report still reads the rows: exact, only slower
        log.info("billing rollup of %s not refreshed: %s", pid, exc)
        return None
    log.info("billing rollup of %s refreshed (%d lines)", pid, len(lines))
    return manifest


def _insert(
    client: Client,
    database: str,
    table: str,
    rows: list[list[Any]],
    columns: list[str],
    refresh_id: str,
) -> None:
    if not rows:
        return
    settings = dict(_INSERT_SETTINGS, insert_deduplication_token=f"{table}:{refresh_id}")
    client.insert(table, rows, column_names=columns, database=database, settings=settings)


def _parse_time(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=UTC)


def _ch_time(value: datetime) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
