"""``prism-pipeline migrate``: create or upgrade the ClickHouse ledger (idempotent)."""

from __future__ import annotations

import argparse

from prism.pipeline.commands._args import load_settings_from, whole
from prism.pipeline.commands.query import add_connection_args, connection

__all__ = ["register"]

# option -> setting field
_OPTIONS = {
    "--clickhouse": "clickhouse_dsn",
    "--database": "clickhouse_database",
    "--cluster": "clickhouse_cluster",
    "--raw-event-ttl-days": "raw_event_ttl_days",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "migrate",
        help="apply the ledger migrations (sinks/migrations) to ClickHouse",
        description=(
            "Creates the database, storage tables and views, recording each applied "
            "migration in <database>.schema_migrations; running it again changes nothing."
        ),
    )
    add_connection_args(p)
    p.add_argument(
        "--cluster",
        help="ON CLUSTER name: Replicated tables for a ClickHouse cluster "
        "(default PRISM_CLICKHOUSE_CLUSTER, none)",
    )
    p.add_argument(
        "--raw-event-ttl-days",
        type=whole(1, 10_000),
        help="days raw events are kept (default PRISM_RAW_EVENT_TTL_DAYS, 90)",
    )
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from prism.sinks import migrate

    settings = load_settings_from(args, _OPTIONS)  # each value named by how it was given
    client, database = connection(args)
    applied = migrate(
        client,
        database,
        cluster=settings.clickhouse_cluster,
        raw_event_ttl_days=settings.raw_event_ttl_days,
    )
    if applied:
        print(f"{database}: applied {', '.join(applied)}")
    else:
        print(f"{database}: up to date")
    return 0
