"""``prism-pipeline rebuild``: replay the input topic from its first offsets into a new ledger."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from prism.pipeline.commands._args import identifier, load_settings_from, whole

__all__ = ["register"]

_DESCRIPTION = """\
Reads every partition of the input topics (agent events, and channel operations when
that topic exists) from its earliest offset up to the end offsets seen at start, through
the same core as the worker, into a new ledger database (migrated first). Joins no
consumer group and commits nothing, so the live worker is untouched. A database that
already holds runs is refused unless --force. Shows a progress bar on a terminal, then a
summary. A rebuild that fails drops the database it created, so no empty one is left."""

_EPILOG = """\
examples:
  prism-pipeline rebuild                            # into prism_rebuild_<UTC time>
  prism-pipeline rebuild --database prism_v2 --batch-size 20000
  PRISM_TOPIC_PREFIX=demo prism-pipeline rebuild --bootstrap 127.0.0.1:19092
  prism-pipeline rebuild --database prism_v2 --clickhouse "https://admin:$PW@ch.example:8443/"
  prism-pipeline query "SELECT status, count() FROM prism_v2.runs GROUP BY status"
"""

# option -> setting field (--database is the new database, not the ledger's)
_OPTIONS = {
    "--bootstrap": "kafka_bootstrap_servers",
    "--topic-prefix": "topic_prefix",
    "--clickhouse": "clickhouse_dsn",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "rebuild",
        help="replay the input topics from their earliest offsets into a fresh ledger database",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--database",
        type=identifier,
        metavar="NEW_DB",
        help="target database (default <PRISM_CLICKHOUSE_DATABASE>_rebuild_<UTC time>)",
    )
    p.add_argument(
        "--clickhouse",
        metavar="DSN",
        help="ledger DSN: chdb://PATH or http(s)://... (default PRISM_CLICKHOUSE_DSN)",
    )
    p.add_argument(
        "--force", action="store_true", help="write into the database even if it already holds runs"
    )
    p.add_argument("--bootstrap", help="Kafka bootstrap servers (PRISM_KAFKA_BOOTSTRAP_SERVERS)")
    p.add_argument("--topic-prefix", help="topic prefix (PRISM_TOPIC_PREFIX)")
    p.add_argument(  # >= 1 is checked with the other options (_run)
        "--batch-size", type=whole(), default=5000, help="records per batch (default 5000)"
    )
    p.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from prism import sinks
    from prism.pipeline.replay import rebuild

    if not args.verbose:
        logging.getLogger("aiokafka").setLevel(logging.WARNING)
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
    settings = load_settings_from(args, _OPTIONS)
    database = args.database or (
        f"{settings.clickhouse_database}_rebuild_{datetime.now(UTC):%Y%m%d%H%M%S}"
    )
    client = sinks.connect(settings.clickhouse_dsn)
    existed = _database_exists(client, database)
    try:
        summary = asyncio.run(
            rebuild(
                settings,
                client,
                database,
                force=args.force,
                progress=not args.no_progress and sys.stderr.isatty(),
                batch_size=args.batch_size,
            )
        )
    except BaseException:
        if not existed:  # a half-built database of ours would only mislead: drop it
            _drop_quietly(client, database)
        raise
    print(summary.render())
    return 0


def _database_exists(client: Any, database: str) -> bool:
    rows = client.query(
        "SELECT count() FROM system.databases WHERE name = {db:String}",
        parameters={"db": database},
    ).result_rows
    return bool(rows[0][0])


def _drop_quietly(client: Any, database: str) -> None:
    """Drop the database this rebuild created; a failure here must not hide the first error."""
    try:
        if _database_exists(client, database):
            client.command(f"DROP DATABASE IF EXISTS `{database}` SYNC")
    except Exception as exc:  # report, then let the original error propagate
        logging.getLogger("prism.replay").warning(
            "could not drop the unfinished database %s: %s", database, exc
        )
