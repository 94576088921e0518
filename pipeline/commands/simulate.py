"""``prism-pipeline simulate``: a deterministic fleet to JSONL and/or Kafka, plus its manifest."""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import sys
from datetime import datetime
from pathlib import Path

from prism.pipeline.commands._args import load_settings_from, number, whole
from prism.runtime.simulator import (
    FleetConfig,
    SimulatorConfigError,
    publish_to_kafka,
    simulate,
    write_jsonl,
    write_manifest,
)

_EPILOG = """\
chaos knobs (all off by default):
  --duplicates P            per record: re-send it a few positions later (a quarter of
                            them as the same (runId, seq) under a new eventId)
  --reorder-window K        a run's records move up to K positions, never past its terminal
  --post-terminal P         per finished run: 1-2 non-terminal events after the terminal
  --conflicting-terminals P per finished run: a second, different terminal after the real one
  --malformed P             per run: a junk record (truncated JSON, invalid UTF-8, non-object
                            JSON, wrong types, a priced estimate), replacing an event or extra
  --oversized P             per run: one event padded over --max-event-bytes, replacing it
  --hostile P               per run, one hostile producer behaviour:
                              reorder_terminal  a priced usage row after the terminal is
                                                delivered before it (still post-terminal)
                              late_tenant       the first 1-3 events omit tenantId
                              clock_skew        the producer stamps ts in the year 2199
                              run_id_collision  another tenant's later run reuses the runId
                              duplicate_usage   one turn's reported usage is sent twice
                              quiet_partition   a run without terminal whose runId hashes to
                                                a partition (of --partitions) no other run uses
  --guardrail-denials P     per run with tool rounds: 1-2 guardrail_denied events
                            (pack:<pack>/<rule>, never the denied content)
  --limit-death-burst N     N runs of one tenant die on maxTurns within ~2 minutes, so the
                            exhaustion alert fires (N >= --alert-threshold)
  --channel-operations N    N messaging-channel admissions to <prefix>.channel-operations:
                            delivered, notices, send threw (delivery_unknown), process died
                            (execution_unknown, or stuck executing), cancellations, denials
                            (capacity bursts among them), transport duplicates, reconciles,
                            out-of-order and illegal transitions
Each knob above 0 happens at least once (where a run fits it). With --runs >= 200 every
scenario appears. Knobs left off keep a fleet byte-identical to one made without them.
The manifest judges event time against --processing-clock (default: the fleet's last
delivery): check a pipeline with the same clock.

examples:
  prism-pipeline simulate --runs 1000 --seed 7 --out fleet.jsonl --manifest manifest.json
  prism-pipeline simulate --runs 5000 --kafka 127.0.0.1:9092 --rate 2000 --duplicates 0.02
  prism-pipeline simulate --runs 3000 --hostile 0.02 --limit-death-burst 6 \\
      --channel-operations 500 --guardrail-denials 0.05 --out fleet.jsonl --manifest m.json
"""


def _probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text} is not a probability; use 0..1")
    return value


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text} must be > 0 and finite")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} must be >= 0")
    return value


def _timestamp(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an ISO 8601 timestamp, e.g. 2026-11-30T00:00:00+00:00"
        ) from None
    if value.utcoffset() is None:
        raise argparse.ArgumentTypeError(f"{text!r} needs a UTC offset, e.g. +00:00")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="generate a realistic, deterministic fleet of agent runs (+ ground-truth manifest)",
        description=(
            "Simulate a fleet of Prism agent runs (tenants, models, tool calls, prompt cache,\n"
            "estimates, limit deaths, delegations, ...) deterministically for --seed; write it\n"
            "as JSONL and/or produce it to Kafka keyed by runId, and write the manifest of\n"
            "what a correct pipeline must conclude from it. Runs start over ~3 h of event time."
        ),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--runs", type=whole(1, 10_000_000), default=1000, help="runs in the fleet (default 1000)"
    )
    p.add_argument("--seed", type=whole(), default=0, help="random seed (default 0)")
    p.add_argument("--out", type=Path, help="write record values as JSONL, one per line")
    p.add_argument("--manifest", type=Path, help="write the ground-truth manifest (JSON)")
    p.add_argument(
        "--kafka",
        nargs="?",
        const="",
        metavar="BOOTSTRAP",
        help="produce to Kafka (default bootstrap: PRISM_KAFKA_BOOTSTRAP_SERVERS)",
    )
    p.add_argument("--topic", help="input topic (default: <PRISM_TOPIC_PREFIX>.agent-events)")
    p.add_argument(
        "--channel-topic",
        help="topic of channel operations (default: beside --topic, <prefix>.channel-operations)",
    )
    p.add_argument(
        "--rate", type=_positive, help="records per second (default: as fast as possible)"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    chaos = p.add_argument_group("chaos (see below)")
    chaos.add_argument("--duplicates", type=_probability, default=0.0, metavar="P")
    chaos.add_argument("--reorder-window", type=whole(0, 1000), default=0, metavar="K")
    chaos.add_argument("--post-terminal", type=_probability, default=0.0, metavar="P")
    chaos.add_argument("--conflicting-terminals", type=_probability, default=0.0, metavar="P")
    chaos.add_argument("--malformed", type=_probability, default=0.0, metavar="P")
    chaos.add_argument("--oversized", type=_probability, default=0.0, metavar="P")
    chaos.add_argument("--hostile", type=_probability, default=0.0, metavar="P")
    chaos.add_argument("--guardrail-denials", type=_probability, default=0.0, metavar="P")
    chaos.add_argument("--limit-death-burst", type=_count, default=0, metavar="N")
    chaos.add_argument("--channel-operations", type=_count, default=0, metavar="N")
    chaos.add_argument(
        "--partitions",
        type=whole(1, 10_000),
        default=4,
        metavar="N",
        help="partitions of the input topic the quiet partition is chosen among "
        "(match PRISM_PARTITIONS; default 4)",
    )
    clock = p.add_argument_group("event time")
    clock.add_argument(
        "--start",
        type=_timestamp,
        help="first run's earliest start (default 2026-11-30T00:00:00+00:00)",
    )
    clock.add_argument(
        "--clock",
        choices=["fixed", "wall"],
        default="fixed",
        help="fixed: start at --start or the default; wall: the fleet's event time ends "
        "near the current time",
    )
    clock.add_argument(
        "--stale-after",
        type=number(0, 365 * 86_400, above=True),
        default=3600.0,
        metavar="SECONDS",
        help="manifest: a run without terminal idle this long before the fleet's last "
        "event is incomplete (default 3600)",
    )
    clock.add_argument(
        "--processing-clock",
        type=_timestamp,
        metavar="TS",
        help="manifest: the pipeline's clock (events beyond it plus 300 s are clock-skewed; "
        "default: the fleet's last delivery time)",
    )
    clock.add_argument(
        "--alert-threshold",
        type=whole(1, 1_000_000),
        default=5,
        metavar="N",
        help="manifest: limit deaths in 300 s of one tenant and axis that fire the exhaustion "
        "alert (PRISM_ALERT_LIMIT_DEATHS_THRESHOLD; default 5)",
    )
    clock.add_argument(
        "--max-event-bytes",
        type=whole(1024, 64 * 1_048_576),
        default=1_048_576,
        metavar="BYTES",
        help="size limit oversized records exceed (default 1048576)",
    )
    p.set_defaults(func=_run)


def _check(args: argparse.Namespace) -> None:
    """The options that bound each other (each alone is checked by its type)."""
    if args.limit_death_burst > args.runs:
        raise ValueError(
            f"--limit-death-burst {args.limit_death_burst} is more than --runs {args.runs}"
        )
    if args.hostile and args.partitions < 2:
        raise ValueError(
            f"--hostile needs --partitions >= 2 (a quiet partition beside the busy ones), "
            f"got --partitions {args.partitions}"
        )


def _run(args: argparse.Namespace) -> int:
    if args.out is None and args.manifest is None and args.kafka is None:
        raise SimulatorConfigError(
            "nothing to do: give --out FILE, --manifest FILE and/or --kafka [BOOTSTRAP]"
        )
    _check(args)
    for flag, path in (("--out", args.out), ("--manifest", args.manifest)):
        # before simulating and publishing: a file that cannot be written loses nothing yet
        if path is not None and not path.parent.is_dir():
            raise ValueError(f"{flag} {path}: the directory {path.parent} does not exist")
        if path is not None and path.is_dir():
            raise ValueError(f"{flag} {path} is a directory; name a file")
    config = FleetConfig(
        runs=args.runs,
        seed=args.seed,
        start=args.start,
        clock=args.clock,
        duplicates=args.duplicates,
        reorder_window=args.reorder_window,
        post_terminal=args.post_terminal,
        conflicting_terminals=args.conflicting_terminals,
        malformed=args.malformed,
        oversized=args.oversized,
        hostile=args.hostile,
        guardrail_denials=args.guardrail_denials,
        limit_death_burst=args.limit_death_burst,
        channel_operations=args.channel_operations,
        partitions=args.partitions,
        stale_after_seconds=args.stale_after,
        max_event_bytes=args.max_event_bytes,
        processing_clock=args.processing_clock,
        alert_threshold=args.alert_threshold,
    )
    fleet = simulate(config)
    manifest = fleet.manifest
    counts = manifest["counts"]
    quarantine = {k: v for k, v in manifest["quarantine"].items() if v}
    print(
        f"simulated {args.runs} runs (seed {args.seed}): {counts['records']} records, "
        f"{counts['valid_records']} valid, {counts['duplicates']} duplicates; "
        f"dlq {manifest['dlq']}, quarantine {quarantine}"
    )
    alerts = manifest["alerts"]["run_limit_exhaustion"]
    if alerts:
        print(
            "expected exhaustion alerts: "
            + ", ".join(f"{a['tenant_id']}/{a['key']} at {a['fired_at']}" for a in alerts)
        )
    if manifest["channels"]:
        ch = manifest["channels"]
        states = {k: v for k, v in ch["operations_by_state"].items() if v}
        print(
            f"channel operations: {ch['counts']['unique_records']} records, {states}, "
            f"{len(ch['open_items'])} open items, {len(ch['stuck'])} stuck"
        )
    if args.out is not None:
        lines = write_jsonl(fleet, args.out)
        print(f"wrote {lines} lines to {args.out}")
    if args.manifest is not None:
        write_manifest(fleet, args.manifest)
        print(f"wrote manifest to {args.manifest}")
    if args.kafka is not None:
        if not args.verbose:  # a failure ends in one line of ours; -v shows the client's log
            logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
        # --kafka alone (an empty value) takes PRISM_KAFKA_BOOTSTRAP_SERVERS
        settings = load_settings_from(
            args, {"--kafka": "kafka_bootstrap_servers"} if args.kafka else {}
        )
        kwargs = settings.aiokafka_kwargs()
        bootstrap = kwargs.pop("bootstrap_servers")
        topic = args.topic or settings.topics.input
        result = asyncio.run(
            publish_to_kafka(
                fleet,
                bootstrap,
                topic,
                rate=args.rate,
                progress=not args.no_progress,
                channel_topic=args.channel_topic,
                **kwargs,
            )
        )
        where = " and ".join(f"{n} to {t}" for t, n in result.per_topic.items())
        if len(result.per_topic) == 1:
            where = f"to {topic}"
        print(
            f"produced {result.records} records {where} at {bootstrap} in "
            f"{result.seconds:.1f} s ({result.rate:,.0f} records/s)",
            file=sys.stdout,
        )
    return 0
