"""Read-side lookups over the ledger views: a run's timeline, ad hoc SQL."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from clickhouse_connect.driver.client import Client

from prism.sinks._client import engine_error, engine_siblings, validate_identifier
from prism.sinks._errors import LedgerQueryError

__all__ = ["QueryResult", "query", "run_timeline"]

log = logging.getLogger(__name__)


class QueryResult:
    """Column names and rows of an ad hoc query (datetimes as aware UTC)."""

    __slots__ = ("columns", "rows")

    def __init__(self, columns: list[str], rows: list[tuple[Any, ...]]) -> None:
        self.columns = columns
        self.rows = rows

    def dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]


def run_timeline(client: Client, database: str, run_id: str) -> dict[str, Any]:
    """A run's record, its turns (in turn order), usage rows and raw events (in seq order).

    ``run`` is ``None`` when the ledger has no record of ``run_id`` (its events, if any,
    are still returned).

    Example::

        tl = run_timeline(client, "prism", "run-42")
        tl["run"]["status"], [t["turn"] for t in tl["turns"]], len(tl["events"])
    """
    validate_identifier(database)
    statements = [sql.format(db=database) for sql in _TIMELINE_SQL]
    runs, turns, usage, events = _rows_at_once(client, statements, {"run_id": run_id})
    return {"run": runs[0] if runs else None, "turns": turns, "usage": usage, "events": events}


# The views' rows of one run (runs, turns, usage, run_events: migrations 0002-0003), read from
# their storage tables: the same FINAL and retraction filter, without the view's own planning
# cost, which was about a third of each lookup (tests hold both to the same rows). runs_store,
# turns_store and run_events_store keep parts up to 256 MiB compact (migration 0009): one
# file per part to read instead of one per column (sinks/SCHEMA.md, "Part formats").
_WHERE = "WHERE run_id = {{run_id:String}}"
_TIMELINE_SQL = (
    f"SELECT * FROM {{db}}.runs_store FINAL {_WHERE}",
    f"SELECT * EXCEPT (retracted) FROM {{db}}.turns_store FINAL {_WHERE} AND NOT retracted "
    "ORDER BY turn, attempt, seq",
    f"SELECT * EXCEPT (version, retracted) FROM {{db}}.usage_store FINAL {_WHERE} "
    "AND NOT retracted ORDER BY seq "
    "SETTINGS do_not_merge_across_partitions_select_final = 1",
    f"SELECT * EXCEPT (version, retracted) FROM {{db}}.run_events_store FINAL {_WHERE} "
    "AND NOT retracted ORDER BY seq, event_id",
)


def query(
    client: Client,
    sql: str,
    parameters: dict[str, Any] | None = None,
    *,
    settings: dict[str, Any] | None = None,
) -> QueryResult:
    """Run one SELECT-like statement; raise ``LedgerQueryError`` with ClickHouse's reason."""
    try:
        result = client.query(sql, parameters=parameters, settings=settings)
    except Exception as exc:
        raise LedgerQueryError(f"query failed: {exc}") from exc
    rows = [tuple(_aware(v) for v in row) for row in result.result_rows]
    return QueryResult(list(result.column_names), rows)


def _rows(client: Client, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    return query(client, sql, params).dicts()


_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
_handles_refused = False


def _rows_at_once(
    client: Client, statements: list[str], params: dict[str, Any]
) -> list[list[dict[str, Any]]]:
    """Each statement's rows, in order. On chDB the first runs here and the others at the
    same time on the engine's other handles (``engine_siblings``): a timeline's lookups
    are each mostly the engine's planning, which one handle would run one after another.
    A server's client runs them one by one, and so does a chDB client whose engine would
    not open another handle (logged once)."""
    global _handles_refused
    try:
        others = engine_siblings(client, len(statements) - 1)
    except Exception as exc:
        if not _handles_refused:
            _handles_refused = True
            log.warning("ledger lookups run one by one: %s", engine_error(exc))
        others = []
    if not others:
        return [_rows(client, sql, params) for sql in statements]
    pool = _threads()
    futures = [
        pool.submit(_rows, c, sql, params) for c, sql in zip(others, statements[1:], strict=True)
    ]
    try:
        first = _rows(client, statements[0], params)
    finally:  # every lookup has ended before this returns or raises
        for future in futures:
            future.exception()
    return [first, *(future.result() for future in futures)]


def _threads() -> ThreadPoolExecutor:
    """The threads the lookups run on; more lookups than threads wait their turn."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(
                len(_TIMELINE_SQL) - 1, thread_name_prefix="prism-ledger-read"
            )
        return _pool


def _aware(value: Any) -> Any:
    # Columns are DateTime64(3, 'UTC'); the driver returns them as naive UTC.
    if isinstance(value, datetime) and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value
