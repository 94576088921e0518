"""``prism-pipeline devstack kafka up|down|status``: the scripted local broker or cluster."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from prism.devstack import LocalKafka, LocalKafkaCluster
from prism.pipeline.commands._args import PORT, whole

_SINGLE_DIR, _CLUSTER_DIR = ".data/kafka", ".data/kafka-cluster"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "devstack",
        help="run a real local Kafka broker or cluster (KRaft) for demos and tests",
        description=(
            "Fetches Apache Kafka's jars from Maven Central once (devstack/kafka/lib) and "
            "runs a single broker+controller on 127.0.0.1, or with --brokers N a local "
            "cluster of N nodes (each one broker and controller, own ports and folder) whose "
            "topics default to replication factor min(3, N) and min.insync.replicas=2."
        ),
        epilog=(
            "examples: prism-pipeline devstack kafka up; "
            "prism-pipeline devstack kafka up --brokers 3 --port 19092 "
            "(brokers on 19092-19094; then PRISM_KAFKA_BOOTSTRAP_SERVERS="
            "127.0.0.1:19092,127.0.0.1:19093,127.0.0.1:19094 PRISM_REPLICATION_FACTOR=3); "
            "prism-pipeline devstack kafka down --brokers 3"
        ),
    )
    p.add_argument("service", choices=["kafka"], help="the service to control")
    p.add_argument("action", choices=["up", "down", "status"])
    p.add_argument(
        "--port",
        type=PORT,
        default=None,
        help="listener port on 127.0.0.1 of the (first) broker; a cluster's others follow "
        "it (env PRISM_KAFKA_PORT, default 9092)",
    )
    p.add_argument(
        "--brokers",
        type=whole(1, 9),
        default=1,
        metavar="N",
        help="1 (default): one broker+controller; N > 1: a local KRaft cluster of N nodes "
        "(down and status find a cluster from its state directory)",
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help=f"data, config, logs and pid files (default {_SINGLE_DIR}, or {_CLUSTER_DIR} "
        "with --brokers > 1; env PRISM_KAFKA_STATE_DIR)",
    )
    p.set_defaults(func=_run)


def _env_port() -> int | None:
    """``PRISM_KAFKA_PORT`` when set, checked as --port is; an error names the variable."""
    text = os.environ.get("PRISM_KAFKA_PORT")
    if text is None:
        return None
    try:
        return PORT(text)
    except argparse.ArgumentTypeError as exc:
        raise ValueError(f"PRISM_KAFKA_PORT {exc}") from None


def _run(args: argparse.Namespace) -> int:
    default = _CLUSTER_DIR if args.brokers > 1 else _SINGLE_DIR
    state_dir = args.state_dir or Path(os.environ.get("PRISM_KAFKA_STATE_DIR", default))
    port = args.port if args.port is not None else _env_port()
    cluster = LocalKafkaCluster.found_in(state_dir) if args.action != "up" else None
    if args.brokers > 1 or cluster is not None:
        return _run_cluster(args, cluster or LocalKafkaCluster(state_dir, args.brokers, port))
    port = port or 9092
    broker = LocalKafka(state_dir=state_dir, port=port)
    if args.action == "up":
        broker.up()
        print(f"kafka up on {broker.bootstrap} (log: {broker.log_file})")
    elif args.action == "down":
        broker.down()
        print("kafka stopped")
    else:
        print(broker.status())
    return 0


def _run_cluster(args: argparse.Namespace, cluster: LocalKafkaCluster) -> int:
    if args.action == "up":
        cluster.up()
        print(f"kafka cluster of {cluster.brokers} brokers up on {cluster.bootstrap}")
        print(
            f"topics default to replication factor {min(3, cluster.brokers)}, "
            f"min.insync.replicas {min(2, cluster.brokers)}; logs: "
            f"{cluster.state_dir}/node-*/broker.log"
        )
    elif args.action == "down":
        cluster.down()
        print(f"kafka cluster of {cluster.brokers} brokers stopped")
    else:
        for line in cluster.status():
            print(line)
    return 0
