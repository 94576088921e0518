"""``prism-pipeline devstack kafka up|down|status``: the scripted local Kafka broker."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from prism.devstack import LocalKafka


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "devstack",
        help="run a real local Kafka broker (KRaft) for demos and tests",
        description=(
            "Fetches Apache Kafka's jars from Maven Central once (devstack/kafka/lib) and "
            "runs a single broker+controller on 127.0.0.1."
        ),
    )
    p.add_argument("service", choices=["kafka"], help="the service to control")
    p.add_argument("action", choices=["up", "down", "status"])
    p.add_argument(
        "--port",
        type=_port,
        # A string default goes through _port only when the command runs without --port, so
        # a bad PRISM_KAFKA_PORT never breaks `--help` or another command.
        default=os.environ.get("PRISM_KAFKA_PORT", "9092"),
        help="listener port on 127.0.0.1 (env PRISM_KAFKA_PORT, default 9092)",
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        default=Path(os.environ.get("PRISM_KAFKA_STATE_DIR", ".data/kafka")),
        help="broker data, config, log and pid file (default .data/kafka)",
    )
    p.set_defaults(func=_run)


def _port(text: str) -> int:
    """A TCP port 1..65535 (from --port or PRISM_KAFKA_PORT)."""
    if not text.strip().isdigit() or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a port 1..65535 (from --port or PRISM_KAFKA_PORT)"
        )
    return int(text)


def _run(args: argparse.Namespace) -> int:
    broker = LocalKafka(state_dir=args.state_dir, port=args.port)
    if args.action == "up":
        broker.up()
        print(f"kafka up on {broker.bootstrap} (log: {broker.log_file})")
    elif args.action == "down":
        broker.down()
        print("kafka stopped")
    else:
        print(broker.status())
    return 0
