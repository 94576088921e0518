"""``prism-pipeline tail``: print a run's events in seq order (Kafka or ledger), or follow all runs.

Exit codes: 0 the run is complete (its terminal and every lower seq printed), 3 it is not
(timeout, or gaps in the ledger; the missing seqs are listed on stderr), 2 a bad option or
setting, 1 a failure (the broker did not answer within --timeout, the ledger).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from typing import Any

from prism.pipeline.commands._args import load_settings_from, number, whole
from prism.pipeline.settings import Settings

__all__ = ["EXIT_INCOMPLETE", "register"]

EXIT_INCOMPLETE = 3
log = logging.getLogger("prism.replay")

_DESCRIPTION = """\
With --run, prints that run's events in seq order from its Kafka partition (from the
run's first offset recorded in the ledger when known, else from the beginning), each
once, and exits 0 after its terminal once every lower seq arrived; after --timeout it
exits 3 with the missing seqs on stderr. --from-ledger replays the run from the ledger's
run_events instead. With --follow, prints every run's events live, one line per event.
With --operation, prints a messaging-channel operation's transitions in seq order from
the channel-operation topic and exits 0 once it reached a final state (delivered,
notice_delivered, cancelled, reconciled); an open item (delivery_unknown,
execution_unknown) waits for a reconcile: exit 3 after --timeout. --timeout bounds
everything, reaching the broker included: a broker that does not answer in time exits 1."""

_EPILOG = """\
examples:
  prism-pipeline tail --run run-42                        # Kafka, until its terminal
  prism-pipeline tail --run run-42 --from-ledger --format pretty
  prism-pipeline tail --run run-42 --timeout 5 --no-ledger
  prism-pipeline tail --follow --tenant acme --type run_failed --timeout 600
  prism-pipeline tail --follow --from-beginning --max-events 20 --format pretty
  prism-pipeline tail --operation op-81 --timeout 30
  PRISM_TOPIC_PREFIX=demo prism-pipeline tail --run run-42 --bootstrap 127.0.0.1:19092

exit codes: 0 complete, 3 incomplete (timeout, or gaps in the ledger), 2 a bad option or
setting, 1 a failure (the broker did not answer within --timeout, the ledger)
"""

# option -> setting field
_OPTIONS = {
    "--bootstrap": "kafka_bootstrap_servers",
    "--topic-prefix": "topic_prefix",
    "--clickhouse": "clickhouse_dsn",
    "--database": "clickhouse_database",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tail",
        help="print one run's events in seq order (or follow every run) from Kafka or the ledger",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--run", metavar="RUN_ID", help="the run to print")
    which.add_argument("--follow", action="store_true", help="tail all runs live")
    which.add_argument("--operation", metavar="OPERATION_ID", help="the channel operation to print")
    p.add_argument(
        "--from-ledger",
        action="store_true",
        help="with --run: replay from the ledger's run_events, not Kafka",
    )
    p.add_argument(
        "--timeout",
        type=number(),  # > 0 is checked with the other options (_check)
        metavar="S",
        help="seconds to wait (--run: default 60, then exit 3; --follow: default none)",
    )
    p.add_argument(
        "--format",
        choices=("jsonl", "pretty"),
        default="jsonl",
        help="jsonl: one envelope per line (default); pretty: a readable summary",
    )
    p.add_argument(
        "--tenant",
        action="append",
        default=[],
        metavar="TENANT",
        help="with --follow: only this tenant (repeatable)",
    )
    p.add_argument(
        "--type",
        action="append",
        default=[],
        metavar="TYPE",
        dest="types",
        help="with --follow: only this event type (repeatable)",
    )
    p.add_argument(
        "--from-beginning",
        action="store_true",
        help="with --follow: start at the earliest offsets instead of the end",
    )
    p.add_argument(
        "--max-events", type=whole(1), metavar="N", help="with --follow: stop after N events"
    )
    p.add_argument("--bootstrap", help="Kafka bootstrap servers (PRISM_KAFKA_BOOTSTRAP_SERVERS)")
    p.add_argument("--topic-prefix", help="topic prefix (PRISM_TOPIC_PREFIX)")
    p.add_argument("--clickhouse", metavar="DSN", help="ledger DSN (PRISM_CLICKHOUSE_DSN)")
    p.add_argument("--database", help="ledger database (PRISM_CLICKHOUSE_DATABASE)")
    p.add_argument(
        "--no-ledger",
        action="store_true",
        help="with --run: do not ask the ledger where the run starts",
    )
    p.set_defaults(func=_run)


def _settings(args: argparse.Namespace) -> Settings:
    return load_settings_from(args, _OPTIONS)


def _check(args: argparse.Namespace) -> None:
    for flag, value in (("--run", args.run), ("--operation", args.operation)):
        if value is not None and not value.strip():
            raise ValueError(f"{flag} needs an id, got {value!r}")
    follow_only = [
        name
        for name, given in (
            ("--tenant", args.tenant),
            ("--type", args.types),
            ("--from-beginning", args.from_beginning),
            ("--max-events", args.max_events is not None),
        )
        if given
    ]
    if args.run is not None and follow_only:
        raise ValueError(f"{', '.join(follow_only)} only apply with --follow, not with --run")
    if args.operation is not None and (follow_only or args.from_ledger or args.no_ledger):
        given = follow_only + [o for o, on in (("--from-ledger", args.from_ledger),
                                                ("--no-ledger", args.no_ledger)) if on]  # fmt: skip
        raise ValueError(f"{', '.join(given)} do not apply with --operation")
    if args.follow and (args.from_ledger or args.no_ledger):
        raise ValueError("--from-ledger and --no-ledger only apply with --run")
    if args.timeout is not None and not args.timeout > 0:
        raise ValueError(f"--timeout must be a number of seconds > 0, got {args.timeout}")


def _run(args: argparse.Namespace) -> int:
    _check(args)
    if not args.verbose:  # keep stderr for what the user asked about
        logging.getLogger("aiokafka").setLevel(logging.WARNING)
    settings = _settings(args)
    if args.follow:
        return _follow(args, settings)
    if args.operation is not None:
        return _operation(args, settings)
    if args.from_ledger:
        return _from_ledger(args, settings)
    return _tail(args, settings)


def _printer(fmt: str, *, with_run: bool = False) -> Any:
    from prism.pipeline.replay import ReplayEvent, format_event

    def emit(ev: ReplayEvent) -> None:
        sys.stdout.write(format_event(ev, fmt, with_run=with_run) + "\n")
        sys.stdout.flush()

    return emit


def _tail(args: argparse.Namespace, settings: Settings) -> int:
    from prism.pipeline.replay import tail_run

    timeout = 60.0 if args.timeout is None else args.timeout
    start = None if args.no_ledger else _ledger_lookup(settings, args.run)
    result = asyncio.run(
        tail_run(settings, args.run, _printer(args.format), timeout=timeout, start_offset=start)
    )
    if result.complete:
        log.debug("%s", result.describe())
        return 0
    print(f"timed out after {timeout:g}s: {result.describe()}", file=sys.stderr)
    return EXIT_INCOMPLETE


def _ledger_lookup(settings: Settings, run_id: str) -> Any:
    """A (topic, partition) -> first offset lookup in the ledger; None when there is no ledger."""
    from prism import sinks
    from prism.pipeline.replay import ledger_start_offset

    target = sinks.parse_dsn(settings.clickhouse_dsn)
    if (
        target.kind == "chdb"
        and target.path != ":memory:"
        and not os.path.exists(target.path or "")
    ):
        return None  # no ledger here; do not create one just to look

    def lookup(topic: str, partition: int) -> int | None:
        database = settings.clickhouse_database
        try:
            client = sinks.connect(settings.clickhouse_dsn, database)
            offset = ledger_start_offset(client, database, topic, partition, run_id)
        except sinks.LedgerError as exc:
            log.warning(
                "ledger not consulted, reading %s[%d] from the beginning: %s", topic, partition, exc
            )
            return None
        log.debug("ledger: run %s starts at %s[%d] offset %s", run_id, topic, partition, offset)
        return offset

    return lookup


def _from_ledger(args: argparse.Namespace, settings: Settings) -> int:
    from prism import sinks
    from prism.pipeline.replay import replay_from_ledger

    # a reader: a ledger that is not there is an error, not a new empty one
    client = sinks.connect(settings.clickhouse_dsn, settings.clickhouse_database, create=False)
    result = replay_from_ledger(
        client, settings.clickhouse_database, args.run, _printer(args.format)
    )
    if result.complete:
        return 0
    print(result.describe(), file=sys.stderr)
    return EXIT_INCOMPLETE


def _follow(args: argparse.Namespace, settings: Settings) -> int:
    from prism.pipeline.replay import follow

    result = asyncio.run(
        follow(
            settings,
            _printer(args.format, with_run=True),
            tenants=args.tenant,
            types=args.types,
            from_beginning=args.from_beginning,
            timeout=args.timeout,
            max_events=args.max_events,
        )
    )
    log.debug("follow: %s", result)
    return 0


def _operation(args: argparse.Namespace, settings: Settings) -> int:
    timeout = 60.0 if args.timeout is None else args.timeout
    result = asyncio.run(_operation_within(args, settings, timeout))
    if result.complete:
        log.debug("%s", result.describe())
        return 0
    print(f"timed out after {timeout:g}s: {result.describe()}", file=sys.stderr)
    return EXIT_INCOMPLETE


async def _operation_within(args: argparse.Namespace, settings: Settings, timeout: float) -> Any:
    """``tail_operation`` within ``timeout`` in all: the broker must answer in that time."""
    from prism.pipeline.replay import format_operation, tail_operation, topic_partitions

    def emit(op: Any) -> None:
        sys.stdout.write(format_operation(op, args.format) + "\n")
        sys.stdout.flush()

    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    # tail_operation gives the broker its own minute; asking first bounds that by --timeout.
    await topic_partitions(settings, settings.topics.channel_operations, deadline=timeout)
    left = max(0.0, end - loop.time())
    return await tail_operation(settings, args.operation, emit, timeout=left)
