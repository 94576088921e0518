"""The ledger a simulated fleet produces, as row counts and digests per table.

A change to the worker's speed must not change the bill. This runs a fixed fleet (seed
20261130; ``--chaos`` adds duplicates, reordering, post-terminal and conflicting events,
malformed and oversized values, hostile tenants, guardrail denials, a limit-death burst
and channel operations) through the same store step as the stage benchmark (``Intake``
over 4 partitions in batches, ``LedgerStore`` -> ``LedgerWriter`` -> chDB), with a fixed
processing clock, then reads every storage table back in full, sorted on all its columns,
and prints per table the number of rows and a SHA-256 of their values. Run it on two
checkouts and compare the output: identical digests mean row-for-row identical ledgers.

Storage tables keep every version a row went through, and where batches cut decides the
intermediate versions, so their digests compare two checkouts at one ``--batch`` only.
``--views`` digests what users query instead (every view of ``sinks.VIEWS``: the current
rows, retractions left out), without the columns that record processing rather than the
events (``version``, how often a row was rewritten, and ``received_at``, the processing
clock at arrival): equal digests at two batch sizes mean the batch size changes no figure
anyone reads (schemas/CONTRACT.md rule 10).

``--billing`` digests the billing reports instead, per month of usage (all tenants under
three groupings, and each tenant alone): ``billing_rollup`` as a report reads them (the
day rollup of sinks/_rollup.py, refreshed first) and ``billing_rows`` from the rows with
``FINAL`` (``rollup=False``, the reference). Then every stored usage row is stored again,
twice under one source range (the second time with the same insert token: deduplicated)
and once more as another ledger folded in (a new token, new parts), the rollup is
refreshed, and the reports are digested again (``billing_*_folded``). All four must be
equal: the fast path gives the reference's bill, and rows stored twice count once.
``billing_rollup_months`` says how many months the rollup answered (0 would prove
nothing), ``usage_store_stored`` how many row versions the table holds (the fold adds
them: they are stored, and still count once).

Run: ``.venv/bin/python -m bench.ledger_digest [--events N] [--batch B] [--chaos]
[--views | --billing]`` (default 100,000 events in batches of 5,000). chDB hosts one
engine per process, so the measuring part runs in a child process.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
import tempfile
import time
from datetime import datetime
from typing import Any

from bench._child import run_child

SEED = 20261130
EVENTS_PER_RUN = 14
PARTITIONS = 4
NOW = 1_800_000_000.0  # the processing clock: fixed, so grace and staleness are too
CHAOS: dict[str, Any] = {
    "duplicates": 0.03,
    "reorder_window": 8,
    "post_terminal": 0.02,
    "conflicting_terminals": 0.02,
    "malformed": 0.01,
    "oversized": 0.002,
    "hostile": 0.02,
    "guardrail_denials": 0.02,
    "limit_death_burst": 20,
    "channel_operations": 300,
}


# Columns of the views that record processing, not the events: left out of --views.
PROCESSING_COLUMNS = frozenset({"version", "received_at"})
# Groupings of the all-tenant reports --billing digests (each tenant's report: the default).
BILLING_GROUPINGS = (("tenant", "provider", "model"), ("tenant", "day"), ("model", "month"))


def digest(
    events: int,
    batch: int = 5000,
    chaos: bool = False,
    views: bool = False,
    billing: bool = False,
) -> dict[str, Any]:
    """{table: [rows, sha256 of the sorted rows]} of the fleet's ledger (child process);
    ``views``: of every view, less ``PROCESSING_COLUMNS``, instead of the storage tables;
    ``billing``: of the billing reports, rollup and rows, before and after a fold."""
    args = ["--events", str(events), "--batch", str(batch)]
    args += (["--chaos"] if chaos else []) + (["--views"] if views else [])
    args += ["--billing"] if billing else []
    rows = run_child("bench.ledger_digest", *args)
    return {r["table"]: [r["rows"], r["sha256"]] for r in rows}


def _sorted_digest(client: Any, source: str, columns: list[str]) -> dict[str, Any]:
    listed = ", ".join(f"`{c}`" for c in columns)
    found = client.query(f"SELECT {listed} FROM {source} ORDER BY {listed}").result_rows
    h = hashlib.sha256()
    for row in found:
        h.update(repr(row).encode())
    return {"rows": len(found), "sha256": h.hexdigest()}


def _digest_lines(reports: list[list[Any]]) -> tuple[int, str]:
    h = hashlib.sha256()
    count = 0
    for lines in reports:
        h.update(b"--report--")
        for line in lines:
            h.update(repr(dataclasses.astuple(line)).encode())
            count += 1
    return count, h.hexdigest()


def _billing_digests(client: Any, db: str, suffix: str = "") -> list[dict[str, Any]]:
    """Digests of every month's reports from the rollup and from the rows (``FINAL``)."""
    from prism.sinks import billing_report, refresh_billing_rollup
    from prism.sinks._rollup import _month_end, _month_start

    months = sorted(
        str(pid)
        for (pid,) in client.query(
            "SELECT DISTINCT partition_id FROM system.parts WHERE database = {db:String} "
            "AND table = 'usage_store' AND active",
            parameters={"db": db},
        ).result_rows
    )
    # A month whose parts a background merge changed while its lines were read is skipped
    # (the next report refreshes it): refresh until every month has current lines, as
    # reports after the merges would find them.
    bounds = {pid: (_month_start(pid), _month_end(pid)) for pid in months}
    for _ in range(50):
        refresh_billing_rollup(client, db)
        if all(_rollup_plan(client, db, *bounds[pid]) for pid in months):
            break
        time.sleep(0.1)
    tenants = [
        str(t)
        for (t,) in client.query(
            f"SELECT DISTINCT tenant_id FROM {db}.billing_usage WHERE tenant_id IS NOT NULL "
            "ORDER BY tenant_id"
        ).result_rows
    ]
    out: dict[str, list[list[Any]]] = {"rollup": [], "rows": []}
    used = 0
    for pid in months:
        lo, hi = bounds[pid]
        used += _rollup_plan(client, db, lo, hi)
        for name, rollup in (("rollup", True), ("rows", False)):
            for dims in BILLING_GROUPINGS:
                out[name].append(billing_report(client, db, lo, hi, group_by=dims, rollup=rollup))
            for tenant in tenants:
                out[name].append(billing_report(client, db, lo, hi, tenant, rollup=rollup))
    rows = []
    for name, reports in out.items():
        count, sha = _digest_lines(reports)
        rows.append({"table": f"billing_{name}{suffix}", "rows": count, "sha256": sha})
    stored = client.query(f"SELECT count() FROM {db}.usage_store").result_rows[0][0]
    return [
        *rows,
        {"table": f"billing_rollup_months{suffix}", "rows": used, "sha256": ""},
        {"table": f"usage_store_stored{suffix}", "rows": int(stored), "sha256": ""},
    ]


def _rollup_plan(client: Any, db: str, lo: datetime, hi: datetime) -> bool:
    """Whether a report of the month from ``lo`` to ``hi`` would read current rollup lines."""
    from prism.sinks._rollup import plan_rollup

    plan = plan_rollup(client, db, lo, hi, price_book=False, refresh_sql="", refresh_before=None)
    return bool(plan and plan.refresh_ids)


def _fold_usage(client: Any, db: str, source: str) -> None:
    """Store every stored usage row (every version) again, twice from one source range (the
    second insert has the first's token: deduplicated), then the same as another ledger
    folded in (a new token, so new parts)."""
    from prism import sinks
    from prism.schemas import LedgerBatch
    from prism.sinks._tables import STORAGE_TABLES

    cls = STORAGE_TABLES["usage"][1]
    names = [f.name for f in dataclasses.fields(cls)]
    found = client.query(f"SELECT {', '.join(names)} FROM {db}.usage_store ORDER BY ALL")
    usage = [cls(**dict(zip(names, row, strict=True))) for row in found.result_rows]
    writer = sinks.LedgerWriter(client, db)
    for label in (source, "file:/folded-ledger.jsonl"):
        writer.add(LedgerBatch(usage=usage), sinks.SourceRange(label, 0, 0, 0))
        writer.flush()
        writer.add(LedgerBatch(usage=usage), sinks.SourceRange(label, 0, 0, 0))
        writer.flush()  # the same rows, range and token again: deduplicated


def _child(
    events: int, batch: int, chaos: bool, views: bool = False, billing: bool = False
) -> list[dict[str, Any]]:
    from bench.bench_stages import keyed_records
    from prism import sinks
    from prism.pipeline._store import LedgerStore, open_ledger
    from prism.pipeline.core import Intake, Output
    from prism.pipeline.settings import Settings
    from prism.runtime.simulator import FleetConfig
    from prism.sinks._tables import STORAGE_TABLES, VIEWS

    config = FleetConfig(
        runs=max(1, events // EVENTS_PER_RUN), seed=SEED, **(CHAOS if chaos else {})
    )
    parts = keyed_records(config, "digest.agent-events", PARTITIONS)
    with tempfile.TemporaryDirectory(prefix="prism-ledger-digest-") as tmp:
        settings = Settings.model_validate({"clickhouse_dsn": f"chdb://{tmp}/ledger"})
        client = open_ledger(settings)
        store = LedgerStore(sinks.LedgerWriter(client, settings.clickhouse_database))
        intake = Intake(settings.core_config(), max_event_bytes=settings.max_event_bytes)
        per = max(1, batch // PARTITIONS)
        for i in range(0, max(map(len, parts.values())), per):
            chunk = {p: recs[i : i + per] for p, recs in parts.items() if recs[i : i + per]}
            out = Output()
            for p, recs in chunk.items():
                out.extend(intake.step(p, recs, NOW + i))
            store(out)
            intake.commit(list(chunk))
        store(intake.finalize(NOW + 10_000_000))
        db = settings.clickhouse_database
        rows = []
        if billing:
            rows += _billing_digests(client, db)
            _fold_usage(client, db, "digest.agent-events")
            rows += _billing_digests(client, db, "_folded")
        elif views:
            for view in VIEWS:
                described = client.query(f"DESCRIBE TABLE {db}.{view}").result_rows
                columns = [str(r[0]) for r in described if r[0] not in PROCESSING_COLUMNS]
                rows.append({"table": view, **_sorted_digest(client, f"{db}.{view}", columns)})
        else:
            for table, cls in STORAGE_TABLES.values():
                columns = [f.name for f in dataclasses.fields(cls)]
                rows.append({"table": table, **_sorted_digest(client, f"{db}.{table}", columns)})
        sinks.close_client(client)  # and its inserts' handles: the folder goes next
    return rows


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.ledger_digest",
        description="Print the row count and SHA-256 of every ledger table a fixed simulated "
        "fleet produces; compare the output of two checkouts.",
    )
    parser.add_argument("--events", type=int, default=100_000, help="fleet size (default 100000)")
    parser.add_argument("--batch", type=int, default=5000, help="events per batch (default 5000)")
    parser.add_argument("--chaos", action="store_true", help="the fleet with every fault injected")
    parser.add_argument(
        "--views",
        action="store_true",
        help="digest the views users query, less version and received_at, instead of the "
        "storage tables: comparable between batch sizes",
    )
    parser.add_argument(
        "--billing",
        action="store_true",
        help="digest the billing reports of every month, from the day rollup and from the "
        "rows (FINAL), before and after every usage row is stored again",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.events < 1 or args.batch < 1:
        parser.error(f"--events and --batch must be positive (got {args.events}, {args.batch})")
    if args.child:
        print(json.dumps(_child(args.events, args.batch, args.chaos, args.views, args.billing)))
        return
    found = digest(args.events, args.batch, args.chaos, args.views, args.billing)
    print(json.dumps(found, indent=1, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1:])
