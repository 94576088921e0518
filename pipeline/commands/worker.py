"""``prism-pipeline worker``: the faust-streaming worker (Kafka -> core -> ClickHouse)."""

from __future__ import annotations

import argparse
import logging

from prism.pipeline.settings import load_settings


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "worker",
        help="consume prism.agent-events, apply run semantics, write the ledger",
        description=(
            "Runs the stream processor. Settings come from PRISM_* variables (see README); "
            "the options below override the most common ones. Migrations are applied at "
            "start. SIGTERM flushes, commits and exits."
        ),
    )
    p.add_argument("--bootstrap", help="Kafka bootstrap servers (PRISM_KAFKA_BOOTSTRAP_SERVERS)")
    p.add_argument("--clickhouse", help="ledger DSN: chdb://PATH or http(s)://user@host:port/db")
    p.add_argument("--database", help="ledger database (PRISM_CLICKHOUSE_DATABASE)")
    p.add_argument("--topic-prefix", help="topic prefix (PRISM_TOPIC_PREFIX)")
    p.add_argument("--group", help="consumer group (PRISM_CONSUMER_GROUP)")
    p.add_argument("--state-dir", help="faust table state directory (PRISM_STATE_DIR)")
    p.add_argument("--state-store", choices=["rocksdb", "memory"], help="table store")
    p.set_defaults(func=_run)


def overrides(args: argparse.Namespace) -> dict[str, object]:
    mapping = {
        "bootstrap": "kafka_bootstrap_servers",
        "clickhouse": "clickhouse_dsn",
        "database": "clickhouse_database",
        "topic_prefix": "topic_prefix",
        "group": "consumer_group",
        "state_dir": "state_dir",
        "state_store": "state_store",
    }
    return {
        field: getattr(args, opt)
        for opt, field in mapping.items()
        if getattr(args, opt, None) is not None
    }


def _run(args: argparse.Namespace) -> int:
    from prism.pipeline.worker import run_worker

    settings = load_settings(**overrides(args))
    return run_worker(settings, loglevel=logging.DEBUG if args.verbose else logging.INFO)
