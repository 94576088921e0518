"""``prism-pipeline devstack kafka up|down|status``: the scripted local broker or cluster."""

from __future__ import annotations

import argparse
import os
import time
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
    p.add_argument(
        "service",
        choices=["kafka", "jaeger", "phoenix"],
        help="the service to control: the Kafka broker, or a trace backend for "
        "`prism-pipeline traces` (Jaeger v2, Arize Phoenix)",
    )
    p.add_argument(
        "action",
        choices=["up", "down", "status", "install"],
        help="install (jaeger, phoenix): build or install it once into .cache, nothing more",
    )
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
        "with --brokers > 1; env PRISM_KAFKA_STATE_DIR; .data/jaeger and .data/phoenix for "
        "those)",
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
    if args.service != "kafka":
        return _run_trace_backend(args.service, args.action, args.state_dir)
    if args.action == "install":
        raise ValueError("install is for jaeger and phoenix; `kafka up` fetches the Kafka jars")
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


def _run_trace_backend(service: str, action: str, state_dir: Path | None) -> int:
    """Jaeger or Phoenix for ``prism-pipeline traces``: install, up, down, status."""
    from prism.devstack._jaeger import LocalJaeger, build_jaeger
    from prism.devstack._phoenix import LocalPhoenix, install_phoenix

    folder = state_dir or Path(f".data/{service}")
    backend = LocalJaeger(folder) if service == "jaeger" else LocalPhoenix(folder)
    if action == "install":
        started = time.monotonic()
        path = build_jaeger() if service == "jaeger" else install_phoenix()
        print(f"{service} ready: {path} ({time.monotonic() - started:.1f}s)")
    elif action == "up":
        backend.up()
        where = backend.query_url if isinstance(backend, LocalJaeger) else backend.url
        print(f"{service} up: UI and query API {where}; OTLP/HTTP {backend.otlp_endpoint}")
        print(f"  send the ledger's runs: prism-pipeline traces --endpoint {backend.otlp_endpoint}")
    elif action == "down":
        backend.down()
        print(f"{service} stopped")
    else:
        print(backend.status())
    return 0
