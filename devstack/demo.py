"""``make demo``: the whole job end to end, into the ledger every command reads by default.

Starts the local Kafka broker (port ``PRISM_KAFKA_PORT``, else 9092, else a free one),
simulates a chaotic Prism fleet (duplicates, reordering, junk, post-terminal noise and a
burst of limit deaths when the simulator offers one) on the wall clock and publishes it,
runs the real worker into the default ledger (``PRISM_CLICKHOUSE_DSN``, by default
``chdb://./.data/ledger``, database ``prism``) until it has drained the topic, prints what
an SRE and a billing analyst ask first, checks every figure the simulator's manifest
knows, writes the HTML report and the Grafana files, and prints the next commands.

The demo replaces a ledger it wrote before; it refuses one it did not write unless
``--reset``. Topics get a fresh prefix per run, so re-running is always clean.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from prism.pipeline.settings import Settings, load_settings
from prism.pipeline.topics import ensure_topics, worker_env
from prism.sinks import redact_dsn

from ._demo_text import next_steps, text_report
from ._kafka import PORT_VARIABLE, LocalKafka, _port_in_use, free_port
from ._truth import compare, render, unread_sections
from .workerproc import WorkerProcess

__all__ = ["DemoError", "main"]

DEFAULT_PORT = 9092
DEMO_DIR = Path(".data/demo")
MARKER = Path(".data/demo-ledger.json")  # which ledger the demo wrote (so it may replace it)


class DemoError(RuntimeError):
    """The demo cannot run as asked; the message says what to do."""


def _port_from_env() -> int | None:
    raw = os.environ.get(PORT_VARIABLE, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise DemoError(f"{PORT_VARIABLE}={raw!r} is not a TCP port; use a number in 1..65535")
    return int(raw)


def choose_port(
    state_dir: Path, requested: int | None, default: int = DEFAULT_PORT
) -> tuple[int, str]:
    """The broker port and why: asked for, the running broker's, ``default``, or a free one."""
    if requested is not None:
        return requested, f"{PORT_VARIABLE}/--kafka-port"
    broker = LocalKafka(state_dir=state_dir)
    running = broker.configured_port() if broker.pid() is not None else None
    if running is not None:
        return running, "the demo broker already running"
    if not _port_in_use(default):
        return default, "the default"
    return free_port(), f"a free port: {default} is taken (set {PORT_VARIABLE} to choose)"


def _chdb_path(dsn: str) -> Path | None:
    return Path(dsn[len("chdb://") :]) if dsn.startswith("chdb://") else None


def reset_ledger(settings: Settings, *, force: bool) -> None:
    """Empty the demo's ledger; refuse a database the demo did not write unless ``force``."""
    dsn, db = settings.clickhouse_dsn.get_secret_value(), settings.clickhouse_database
    ours = False
    if MARKER.exists():
        mark = json.loads(MARKER.read_text())
        ours = (mark.get("dsn"), mark.get("database")) == (redact_dsn(dsn), db)
    path = _chdb_path(dsn)
    if path is not None:  # the embedded engine: the worker child owns it, so use the files
        exists = (path / "metadata" / f"{db}.sql").exists()
        if exists and not ours and not force:
            raise DemoError(_refusal(dsn, db))
        if ours or force:
            shutil.rmtree(path, ignore_errors=True)
        return
    from prism import sinks

    client = sinks.connect(dsn)
    found = client.query(
        "SELECT count() FROM system.databases WHERE name = {db:String}", parameters={"db": db}
    ).result_rows[0][0]
    if found and not ours and not force:
        raise DemoError(_refusal(dsn, db))
    client.command(f"DROP DATABASE IF EXISTS `{db}` SYNC")


def _refusal(dsn: str, db: str) -> str:

    return (
        f"the default ledger {redact_dsn(dsn)} already holds database {db!r}, which make demo "
        "did not write; the demo writes there so that every command reads it without flags. "
        "Move it away (make clean removes .data), point PRISM_CLICKHOUSE_DSN elsewhere, or "
        "run `python -m prism.devstack.demo --reset` to replace it"
    )


def fleet_config(runs: int, seed: int, burst: int) -> Any:
    """The demo's chaotic fleet on the wall clock, with the knobs this simulator offers."""
    from prism.runtime.simulator import FleetConfig

    knobs: dict[str, Any] = {
        "runs": runs,
        "seed": seed,
        "clock": "wall",
        "duplicates": 0.03,
        "reorder_window": 3,
        "post_terminal": 0.02,
        "conflicting_terminals": 0.01,
        "malformed": 0.005,
        "oversized": 0.001,
        "guardrail_denials": 0.02,
        "limit_death_burst": burst,
        "channel_operations": max(50, runs // 5),  # messaging-channel traffic
    }
    offered = {f.name for f in dataclasses.fields(FleetConfig)}
    return FleetConfig(**{k: v for k, v in knobs.items() if k in offered})


class _Drain:
    """A progress bar on a terminal, else a lag line every few seconds."""

    def __init__(self, total: int) -> None:
        from tqdm import tqdm

        self.tty = sys.stderr.isatty()
        self.bar = tqdm(
            total=total, unit="rec", desc="      committed", file=sys.stderr, disable=not self.tty
        )
        self.last_line = 0.0

    def __call__(self, lag: int, total: int) -> None:
        self.bar.total = max(self.bar.total or 0, total)
        self.bar.update(max(0, total - lag - self.bar.n))
        if not self.tty and time.monotonic() - self.last_line >= 5:
            self.last_line = time.monotonic()
            print(f"      lag {lag:,} of {total:,} records", flush=True)

    def close(self) -> None:
        self.bar.close()


def _run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    # The client retries what a busy broker answers (NotLeaderForPartition, ...) by itself.
    logging.getLogger("aiokafka").setLevel(logging.ERROR)
    port, why = choose_port(args.kafka_state_dir, args.kafka_port)
    broker = LocalKafka(state_dir=args.kafka_state_dir, port=port)
    print(f"[1/6] Kafka on {broker.bootstrap} ({why}; state in {args.kafka_state_dir})")
    broker.up()
    prefix = f"demo{int(time.time())}"
    settings = load_settings(
        kafka_bootstrap_servers=broker.bootstrap,
        topic_prefix=prefix,
        consumer_group=f"{prefix}-pipeline",
        state_dir=DEMO_DIR / "state",
        grace_period_seconds=2.0,
    )
    reset_ledger(settings, force=args.reset)
    shutil.rmtree(DEMO_DIR, ignore_errors=True)
    DEMO_DIR.mkdir(parents=True)
    from prism.runtime.simulator import publish_to_kafka, simulate, write_manifest

    config = fleet_config(args.runs, args.seed, args.limit_death_burst)
    burst = getattr(config, "limit_death_burst", 0)
    print(
        f"[2/6] simulating {args.runs:,} runs (seed {args.seed}: duplicates, reordering, junk, "
        "post-terminal noise, guardrail denials, channel operations"
        + (f", a burst of {burst} limit deaths)" if burst else "; no limit-death burst)")
    )
    fleet = simulate(config)
    write_manifest(fleet, DEMO_DIR / "manifest.json")
    asyncio.run(ensure_topics(settings))
    asyncio.run(
        publish_to_kafka(
            fleet, settings.kafka_bootstrap_servers, settings.topics.input, progress=True
        )
    )
    channel = sum(1 for r in fleet.records if getattr(r, "family", "agent") == "channel")
    print(
        f"      published {len(fleet.records) - channel:,} records to {settings.topics.input}"
        + (f" and {channel:,} to {settings.topics.channel_operations}" if channel else "")
    )
    log = DEMO_DIR / "worker.log"
    print(f"[3/6] the worker drains the topic into {settings.clickhouse_dsn} (log: {log})")
    drain = _Drain(len(fleet.records))
    t0 = time.monotonic()
    try:
        with WorkerProcess(worker_env(settings), log_path=log) as worker:
            worker.wait_drained(
                settings.topics.input,
                settings.consumer_group,
                timeout=600,
                settle=4.0,
                on_progress=drain,
            )
            if channel:  # the channel operations share the consumer group
                worker.wait_drained(
                    settings.topics.channel_operations,
                    settings.consumer_group,
                    timeout=120,
                    settle=2.0,
                )
            # The alerter reads limit deaths from its own topic: let it catch up too.
            worker.wait_drained(
                f"{settings.topic_prefix}.limit-deaths",
                settings.consumer_group,
                timeout=120,
                settle=2.0,
            )
    finally:
        drain.close()
    MARKER.write_text(
        json.dumps(
            {"dsn": redact_dsn(settings.clickhouse_dsn), "database": settings.clickhouse_database}
        )
    )
    stop = next((ln for ln in log.read_text().splitlines() if "worker stopping:" in ln), "")
    print(f"      drained in {time.monotonic() - t0:.1f}s; {stop.split('worker stopping: ')[-1]}")

    from prism import sinks

    db = settings.clickhouse_database
    client = sinks.connect(settings.clickhouse_dsn, db)
    print(f"[4/6] the ledger {settings.clickhouse_dsn}, database {db}")
    print(text_report(client, db))
    checks = compare(client, db, fleet.manifest, fleet.events)
    ok = all(c.ok for c in checks)
    print(
        "\nGround truth: "
        + ("every figure below matches" if ok else "MISMATCH")
        + " the simulator's manifest (.data/demo/manifest.json)"
    )
    print(render(checks, unread_sections(fleet.manifest)))

    from prism.pipeline.report import build_report

    report = build_report(client, db, ledger=redact_dsn(settings.clickhouse_dsn))
    page = report.write(args.report)
    drawn = len(report.results) - len(report.empty) - len(report.failed)
    print(f"[5/6] HTML report: {page} ({drawn} of {len(report.results)} panels with data)")
    from prism.dashboards import build_all

    written = build_all()
    print(
        f"[6/6] wrote {len(written)} Grafana files under dashboards/ (they read a ClickHouse "
        "server: docker compose up; the HTML report shows the same panels without one)"
    )
    print(next_steps(client, db, settings, page, broker, fleet.manifest))
    print(f"\ndemo finished in {time.monotonic() - started:.0f}s")
    return 0 if ok and not report.failed else 1


def main(argv: list[str] | None = None) -> int:
    """Run the demo; a failure prints one line (the broker's log and worker log are kept)."""
    p = argparse.ArgumentParser(
        prog="python -m prism.devstack.demo", description=(__doc__ or "").splitlines()[0]
    )
    p.add_argument(
        "--kafka-port",
        type=int,
        default=None,
        help=f"broker port (default {PORT_VARIABLE}, else {DEFAULT_PORT}, else a free port)",
    )
    p.add_argument("--kafka-state-dir", type=Path, default=Path(".data/kafka"))
    p.add_argument("--runs", type=int, default=3000, help="runs in the simulated fleet")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument(
        "--limit-death-burst",
        type=int,
        default=12,
        metavar="N",
        help="runs of one tenant dying on one limit axis at once (fires the exhaustion alert)",
    )
    p.add_argument("--report", type=Path, default=Path(".data/report.html"), metavar="PATH")
    p.add_argument(
        "--reset", action="store_true", help="replace a default ledger the demo did not write"
    )
    args = p.parse_args(argv)
    try:
        if args.kafka_port is None:
            args.kafka_port = _port_from_env()
        return _run(args)
    except KeyboardInterrupt:
        return 130
    except (RuntimeError, ValueError, OSError, TimeoutError) as exc:
        print(f"make demo: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
