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

Run: ``.venv/bin/python -m bench.ledger_digest [--events N] [--batch B] [--chaos] [--views]``
(default 100,000 events in batches of 5,000). chDB hosts one engine per process, so the
measuring part runs in a child process.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
import tempfile
from typing import Any

from bench._child import run_child

SEED = 20261130
EVENTS_PER_RUN = 14
PARTITIONS = 4
NOW = 1_800_000_000.0  # the processing clock: fixed, so grace and staleness are too
CHAOS = {
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


def digest(
    events: int, batch: int = 5000, chaos: bool = False, views: bool = False
) -> dict[str, Any]:
    """{table: [rows, sha256 of the sorted rows]} of the fleet's ledger (child process);
    ``views``: of every view, less ``PROCESSING_COLUMNS``, instead of the storage tables."""
    args = ["--events", str(events), "--batch", str(batch)]
    args += (["--chaos"] if chaos else []) + (["--views"] if views else [])
    rows = run_child("bench.ledger_digest", *args)
    return {r["table"]: [r["rows"], r["sha256"]] for r in rows}


def _sorted_digest(client: Any, source: str, columns: list[str]) -> dict[str, Any]:
    listed = ", ".join(f"`{c}`" for c in columns)
    found = client.query(f"SELECT {listed} FROM {source} ORDER BY {listed}").result_rows
    h = hashlib.sha256()
    for row in found:
        h.update(repr(row).encode())
    return {"rows": len(found), "sha256": h.hexdigest()}


def _child(events: int, batch: int, chaos: bool, views: bool = False) -> list[dict[str, Any]]:
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
        if views:
            for view in VIEWS:
                described = client.query(f"DESCRIBE TABLE {db}.{view}").result_rows
                columns = [str(r[0]) for r in described if r[0] not in PROCESSING_COLUMNS]
                rows.append({"table": view, **_sorted_digest(client, f"{db}.{view}", columns)})
        else:
            for table, cls in STORAGE_TABLES.values():
                columns = [f.name for f in dataclasses.fields(cls)]
                rows.append({"table": table, **_sorted_digest(client, f"{db}.{table}", columns)})
        client.close()
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
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.events < 1 or args.batch < 1:
        parser.error(f"--events and --batch must be positive (got {args.events}, {args.batch})")
    if args.child:
        print(json.dumps(_child(args.events, args.batch, args.chaos, args.views)))
        return
    found = digest(args.events, args.batch, args.chaos, args.views)
    print(json.dumps(found, indent=1, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1:])
