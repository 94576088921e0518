"""``prism-pipeline worker``: the Kafka worker (Kafka -> core -> ClickHouse)."""

from __future__ import annotations

import argparse
import logging

from prism.pipeline.commands._args import load_settings_from

_DESCRIPTION = """\
Runs the stream processor. Settings come from PRISM_* variables (see README); the options
below override the most common ones. The configuration is checked and the ledger opened
and migrated before anything is done on the broker (topics are created next). SIGTERM
flushes, commits and exits. GET /metrics and /healthz on PRISM_METRICS_HOST:PORT
(127.0.0.1:9464 by default; PRISM_METRICS_PORT=0 turns them off)."""

_EPILOG = """\
examples:
  prism-pipeline worker
  prism-pipeline worker --bootstrap 127.0.0.1:19092 --topic-prefix demo
  prism-pipeline worker --clickhouse "https://prism_writer:$PW@ch.example:8443/prism" \\
      --group prism-eu --state-dir /var/lib/prism/state
  PRISM_METRICS_PORT=9465 prism-pipeline worker --state-store memory
  curl -s 127.0.0.1:9464/metrics | grep prism_      # while it runs
"""

# option -> setting field; the settings validate the values, by the flag's name
OPTIONS = {
    "--bootstrap": "kafka_bootstrap_servers",
    "--clickhouse": "clickhouse_dsn",
    "--database": "clickhouse_database",
    "--topic-prefix": "topic_prefix",
    "--group": "consumer_group",
    "--state-dir": "state_dir",
    "--state-store": "state_store",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "worker",
        help="consume the agent events and channel operations, apply run semantics, "
        "write the ledger",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--bootstrap", help="Kafka bootstrap servers (PRISM_KAFKA_BOOTSTRAP_SERVERS)")
    p.add_argument("--clickhouse", help="ledger DSN: chdb://PATH or http(s)://user@host:port/db")
    p.add_argument("--database", help="ledger database (PRISM_CLICKHOUSE_DATABASE)")
    p.add_argument("--topic-prefix", help="topic prefix (PRISM_TOPIC_PREFIX)")
    p.add_argument("--group", help="consumer group (PRISM_CONSUMER_GROUP)")
    p.add_argument("--state-dir", help="where worker-stats.json is written (PRISM_STATE_DIR)")
    p.add_argument("--state-store", choices=["rocksdb", "memory"],
                   help="unused by the worker (kept so existing configurations load)")  # fmt: skip
    p.set_defaults(func=_run)


def overrides(args: argparse.Namespace) -> dict[str, object]:
    """The setting fields the options given set (the fault harness reads them so)."""
    return {
        field: getattr(args, flag[2:].replace("-", "_"))
        for flag, field in OPTIONS.items()
        if getattr(args, flag[2:].replace("-", "_"), None) is not None
    }


def _run(args: argparse.Namespace) -> int:
    from prism.pipeline.worker import run_worker

    settings = load_settings_from(args, OPTIONS)
    return run_worker(settings, loglevel=logging.DEBUG if args.verbose else logging.INFO)
