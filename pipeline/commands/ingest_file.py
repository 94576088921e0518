"""``prism-pipeline ingest-file PATH``: replay JSONL envelopes through the core into the ledger."""

from __future__ import annotations

import argparse
import os
import sys

from prism.pipeline.commands._args import load_settings_from, whole

_DESCRIPTION = """\
Runs the same run-semantics core as the worker over a JSONL file (one envelope per line,
'-' for stdin): for backfills, debugging and reproducible results. Agent events and
channel operations may be mixed: each line goes to its family's semantics by its schema
field. Malformed lines go to the dead_letters table with their line number. At the end
every run whose terminal arrived is closed and the stale rule is applied on the event-time
watermark. The run state is kept in the ledger (table ingest_state), so a backfill split
over several files gives the ledger one file would. Ingesting the same file again changes
nothing. Prints a summary.

Runs as the worker does: batches of PRISM_BATCH_MAX_EVENTS lines (20000 by default), the
collector kept out of a batch (its survivors frozen, a full pass once a minute between
batches) and the GIL switch interval PRISM_GIL_SWITCH_INTERVAL_SECONDS (0.05 s). The next
batch is parsed while this one is inserted (PRISM_PARSE_AHEAD=false: each batch is parsed
in its own step; the ledger is the same either way)."""

_EPILOG = """\
examples:
  prism-pipeline simulate --runs 500 --seed 7 --out fleet.jsonl
  prism-pipeline ingest-file fleet.jsonl
  zcat backfill-2026-11.jsonl.gz | prism-pipeline ingest-file - --no-progress
  prism-pipeline ingest-file fleet.jsonl --clickhouse chdb://./.data/scratch --batch-size 20000
  prism-pipeline query "SELECT status, count() AS runs FROM runs GROUP BY status"
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "ingest-file",
        help="replay a JSONL file of envelopes into the ledger (no Kafka)",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("path", help="JSONL file, or - for standard input")
    p.add_argument("--clickhouse", help="ledger DSN (default PRISM_CLICKHOUSE_DSN)")
    p.add_argument("--database", help="ledger database (default PRISM_CLICKHOUSE_DATABASE)")
    p.add_argument(
        "--batch-size",
        type=whole(1),
        help="lines per batch (default PRISM_BATCH_MAX_EVENTS, the worker's: 20000)",
    )
    p.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    import uuid

    from prism import sinks
    from prism.pipeline._store import LedgerStore, open_ledger
    from prism.pipeline.ingest import ingest_lines, iter_lines, open_input
    from prism.pipeline.worker._gc import GcPolicy
    from prism.pipeline.worker._run import switch_interval

    settings = load_settings_from(
        args, {"--clickhouse": "clickhouse_dsn", "--database": "clickhouse_database"}
    )
    if args.path != "-" and not os.path.isfile(args.path):
        raise FileNotFoundError(f"no such file: {args.path!r}")
    client = open_ledger(settings)
    store = LedgerStore(sinks.LedgerWriter(client, settings.clickhouse_database))
    bar = None
    if not args.no_progress and sys.stderr.isatty():
        from tqdm import tqdm

        total = None if args.path == "-" else _count_lines(args.path)
        bar = tqdm(total=total, unit="line", desc="ingest", file=sys.stderr)
    # A file is known by its path, so ingesting it again changes nothing; standard input
    # cannot be recognised, so each reading is a source of its own.
    source = f"stdin:{uuid.uuid4()}" if args.path == "-" else "file:" + os.path.abspath(args.path)
    with open_input(args.path) as stream, switch_interval(settings.gil_switch_interval_seconds):
        summary = ingest_lines(
            iter_lines(stream, settings.max_event_bytes),
            source=source,
            store=store,
            config=settings.core_config(processing_grace=False),
            state=sinks.StateTable(client, settings.clickhouse_database),
            batch_size=args.batch_size or settings.batch_max_events,
            max_event_bytes=settings.max_event_bytes,
            parse_ahead=settings.parse_ahead,
            on_batch=bar.update if bar is not None else None,
            gc_policy=GcPolicy(),
        )
    if bar is not None:
        bar.close()
    print(summary.render())
    return 0


def _count_lines(path: str) -> int:
    with open(path, "rb") as f:
        return sum(buf.count(b"\n") for buf in iter(lambda: f.read(1 << 20), b""))
