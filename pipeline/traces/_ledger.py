"""Read runs from the ledger for the trace export: records, events, usage, billed cost.

Everything is read from the views (deduplicated, retractions left out), a chunk of runs
at a time. The billed cost of each usage row is ``billing``'s own query grouped by the
row's event id, so a trace shows the figure the invoice shows (the runtime's cost, or the
price book's for reported usage without one; estimates never).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from clickhouse_connect.driver.client import Client

from prism.schemas import RawEventRow, RunRow, UsageRow
from prism.sinks import query
from prism.sinks._billing import _SQL, _SQL_RUNTIME

from ._mapping import BilledCost, RunFacts, trace_roots

__all__ = ["RunSelection", "billed_costs", "read_runs", "select_runs"]

CHUNK = 500  # runs per query
_OPEN = ("running", "suspended")
_RUN_FIELDS = [f.name for f in fields(RunRow)]
_EVENT_FIELDS = [f.name for f in fields(RawEventRow) if f.name not in ("version", "retracted")]
_USAGE_FIELDS = [f.name for f in fields(UsageRow) if f.name not in ("version", "retracted")]


@dataclass(frozen=True, slots=True)
class RunSelection:
    """Which runs to export: ids, a period of start times ``[start, end)``, a tenant.

    Open runs (``running``, ``suspended``) are left out unless ``include_open``; their
    trace would end at their last event so far.
    """

    run_ids: Sequence[str] = ()
    start: datetime | None = None
    end: datetime | None = None
    tenant: str | None = None
    include_open: bool = False
    limit: int | None = None


def select_runs(client: Client, database: str, selection: RunSelection) -> list[str]:
    """The ids of the runs ``selection`` names, by start time then id."""
    where: list[str] = ["1"]
    params: dict[str, Any] = {}
    if selection.run_ids:
        where.append("run_id IN {ids:Array(String)}")
        params["ids"] = list(selection.run_ids)
    if selection.start is not None:
        where.append("ifNull(started_at, last_event_at) >= {start:DateTime64(3, 'UTC')}")
        params["start"] = selection.start
    if selection.end is not None:
        where.append("ifNull(started_at, last_event_at) < {end:DateTime64(3, 'UTC')}")
        params["end"] = selection.end
    if selection.tenant is not None:
        where.append("tenant_id = {tenant:String}")
        params["tenant"] = selection.tenant
    if not selection.include_open:
        where.append(f"status NOT IN {_OPEN!r}")
    limit = f" LIMIT {int(selection.limit)}" if selection.limit else ""
    sql = (
        f"SELECT run_id FROM {database}.runs WHERE {' AND '.join(where)} "
        f"ORDER BY ifNull(started_at, last_event_at), run_id{limit}"
    )
    return [str(r[0]) for r in query(client, sql, params).rows]


def read_runs(
    client: Client, database: str, run_ids: Sequence[str], chunk: int = CHUNK
) -> Iterator[tuple[RunFacts, str, dict[str, BilledCost]]]:
    """Each run's facts, the top run of its delegation tree, and its usage rows' billed cost."""
    for i in range(0, len(run_ids), chunk):
        ids = list(run_ids[i : i + chunk])
        runs = {r.run_id: r for r in _rows(client, database, "runs", _RUN_FIELDS, ids, RunRow)}
        events = _grouped(_rows(client, database, "run_events", _EVENT_FIELDS, ids, RawEventRow))
        usage = _grouped(_rows(client, database, "usage", _USAGE_FIELDS, ids, UsageRow))
        roots = trace_roots(_ancestors(client, database, runs), runs)
        costs = billed_costs(client, database, ids)
        for run_id in ids:
            run = runs.get(run_id)
            if run is None:
                continue
            facts = RunFacts(run, events.get(run_id, []), usage.get(run_id, []))
            mine = {u.event_id: costs[u.event_id] for u in facts.usage if u.event_id in costs}
            yield facts, roots[run_id], mine


def _rows(
    client: Client, database: str, view: str, columns: list[str], ids: list[str], cls: Any
) -> list[Any]:
    order = " ORDER BY run_id, seq, event_id" if view != "runs" else ""
    sql = (
        f"SELECT {', '.join(columns)} FROM {database}.{view} "
        f"WHERE run_id IN {{ids:Array(String)}}{order}"
    )
    result = query(client, sql, {"ids": ids})
    return [cls(**dict(zip(result.columns, row, strict=True))) for row in result.rows]


def _grouped(rows: list[Any]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for row in rows:
        out.setdefault(row.run_id, []).append(row)
    return out


def _ancestors(client: Client, database: str, runs: dict[str, RunRow]) -> dict[str, str | None]:
    """run -> parent run for the runs and every ancestor the ledger holds."""
    parents: dict[str, str | None] = {r.run_id: r.parent_run_id for r in runs.values()}
    wanted = {p for p in parents.values() if p and p not in parents}
    for _ in range(64):  # delegation depth; a cycle ends when nothing new is wanted
        if not wanted:
            break
        rows = query(
            client,
            f"SELECT run_id, parent_run_id FROM {database}.runs "
            "WHERE run_id IN {ids:Array(String)}",
            {"ids": sorted(wanted)},
        ).rows
        found = {str(r): p for r, p in rows}
        parents.update(found)
        wanted = {p for p in found.values() if p and p not in parents}
    return parents


def billed_costs(client: Client, database: str, run_ids: Sequence[str]) -> dict[str, BilledCost]:
    """The billed cost of each priced ``provider_turn`` usage row of the runs, by event id.

    ``billing``'s SQL (sinks._billing) grouped by event id over all time: the same rows
    (superseded and retracted left out), the same pricing (the runtime's cost first, else
    the price book at the row's time), so a span carries the figure the invoice has.
    """
    book = query(client, f"SELECT count() FROM {database}.prices_store").rows[0][0]
    template = _SQL if book else _SQL_RUNTIME
    indent = "            " if book else "    "
    sql = template.format(
        db=database,
        dims="event_id, ",
        dim_exprs=f"u.event_id AS event_id,\n{indent}",
        runs_join="",
        tenant_filter="\n          AND u.run_id IN {ids:Array(String)}",
    )
    params = {
        "start": "1970-01-01 00:00:00.000",
        "end": "2200-01-01 00:00:00.000",
        "ids": list(run_ids),
    }
    result = query(client, sql, params).dicts()
    return {
        str(r["event_id"]): BilledCost(r["cost"], r["currency"], str(r["priced_by"]))
        for r in result
        if r["cost"] is not None and r["kind"] == "reported"
    }
