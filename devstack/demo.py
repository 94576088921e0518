"""``make demo``: the whole job on the embedded default, end to end, then a report.

Starts the local Kafka broker, simulates a chaotic Prism fleet and publishes it, runs the
real worker (faust) into an embedded chDB ledger until it has drained the topic, stops it
with SIGTERM, prints what an SRE and a billing analyst would ask first, checks the figures
against the simulator's ground truth, and writes the Grafana files.

Every demo uses fresh topics (a timestamped prefix) and a fresh ledger under
``.data/demo/``, so it can be re-run at will.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from prism.pipeline.settings import load_settings
from prism.pipeline.topics import ensure_topics, worker_env

from ._kafka import LocalKafka
from .workerproc import WorkerProcess

__all__ = ["main"]


def _table(title: str, header: tuple[str, ...], rows: list[tuple[Any, ...]]) -> str:
    cells = [tuple(_fmt(v) for v in r) for r in rows] or [tuple("-" for _ in header)]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(header)]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    body = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join([f"\n{title}", line, "-" * len(line), *body])


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def report(client: Any, db: str) -> str:
    """The demo report: runs, exhaustion, cache, billing, alerts, rejects."""

    def rows(sql: str) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in client.query(sql).result_rows]

    parts = [
        _table(
            "Runs by status",
            ("status", "runs"),
            rows(f"SELECT status, count() FROM {db}.runs GROUP BY status ORDER BY 2 DESC"),
        ),
        _table(
            "Top exhaustion axes (runs that died on a limit)",
            ("limit", "runs", "axis blamed"),
            rows(
                f"SELECT exhaustion_limit, count(), any(exhaustion_axis) FROM {db}.runs "
                f"WHERE exhaustion_limit IS NOT NULL AND status = 'failed' "
                f"GROUP BY exhaustion_limit ORDER BY 2 DESC LIMIT 5"
            ),
        ),
        _table(
            "Prompt-cache hit rate by model (token-weighted)",
            ("provider", "model", "hit rate", "turns reporting", "turns not reporting"),
            rows(
                f"SELECT provider, model, sum(cache_read_tokens) / "
                f"nullIf(sum(input_tokens_reporting_cache), 0), sum(turns_reporting_cache), "
                f"sum(turns_not_reporting_cache) FROM {db}.cache_hits_1m "
                f"GROUP BY provider, model ORDER BY provider, model"
            ),
        ),
        _table(
            "Billable provider_turn tokens by tenant (reported usage only)",
            ("tenant", "input", "output", "cost", "currency"),
            rows(
                f"SELECT tenant_id, sum(input_tokens), sum(output_tokens), "
                f"toString(sum(cost)), currency FROM {db}.billing_usage WHERE NOT estimated "
                f"GROUP BY tenant_id, currency ORDER BY tenant_id, currency"
            ),
        ),
        _table(
            "Estimated (never priced) tokens by tenant and confidence",
            ("tenant", "confidence", "total tokens"),
            rows(
                f"SELECT tenant_id, confidence, sum(total_tokens) FROM {db}.billing_usage "
                f"WHERE estimated AND NOT superseded GROUP BY tenant_id, confidence "
                f"ORDER BY tenant_id, confidence"
            ),
        ),
        _table(
            "Alerts raised",
            ("rule", "state", "alerts"),
            rows(
                f"SELECT rule, state, count() FROM {db}.alerts GROUP BY rule, state "
                f"ORDER BY rule, state"
            ),
        ),
        _table(
            "Rejected input",
            ("where", "reason", "records"),
            rows(
                f"SELECT 'dead letter', code, count() FROM {db}.dead_letters GROUP BY code "
                f"UNION ALL SELECT 'quarantine', reason, count() FROM {db}.quarantine "
                f"GROUP BY reason ORDER BY 1, 2"
            ),
        ),
    ]
    return "\n".join(parts)


def check(client: Any, db: str, manifest: dict[str, Any]) -> list[str]:
    """Headline figures against the simulator's ground truth (empty when they agree)."""
    problems = []
    got = dict(client.query(f"SELECT status, count() FROM {db}.runs GROUP BY status").result_rows)
    want: dict[str, int] = {}
    for run in manifest["runs"].values():
        want[run["status"]] = want.get(run["status"], 0) + 1
    if got != want:
        problems.append(f"runs by status {got} != ground truth {want}")
    billed = dict(
        client.query(
            f"SELECT tenant_id, sum(total_tokens) FROM {db}.billing_usage WHERE NOT estimated "
            f"GROUP BY tenant_id"
        ).result_rows
    )
    for tenant, t in manifest["tenants"].items():
        if int(billed.get(tenant) or 0) != t["billable"]["total_tokens"]:
            problems.append(
                f"billable tokens of {tenant}: {billed.get(tenant)} != "
                f"{t['billable']['total_tokens']}"
            )
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m prism.devstack.demo", description=__doc__.splitlines()[0]
    )
    p.add_argument("--kafka-port", type=int, default=9092)
    p.add_argument("--kafka-state-dir", type=Path, default=Path(".data/kafka"))
    p.add_argument("--runs", type=int, default=3000, help="runs in the simulated fleet")
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args(argv)

    from prism.runtime.simulator import FleetConfig, publish_to_kafka, simulate, write_manifest

    broker = LocalKafka(state_dir=args.kafka_state_dir, port=args.kafka_port)
    print(f"[1/5] starting Kafka on {broker.bootstrap} (jars cached in devstack/kafka/lib)")
    broker.up()
    demo_dir = Path(".data/demo")
    shutil.rmtree(demo_dir, ignore_errors=True)
    demo_dir.mkdir(parents=True)
    prefix = f"demo{int(time.time())}"
    settings = load_settings(
        kafka_bootstrap_servers=broker.bootstrap,
        topic_prefix=prefix,
        consumer_group=f"{prefix}-pipeline",
        clickhouse_dsn=f"chdb://{demo_dir / 'ledger'}",
        state_dir=demo_dir / "state",
        grace_period_seconds=2.0,
    )
    print(
        f"[2/5] simulating {args.runs} runs (seed {args.seed}, with duplicates, reordering, "
        "junk and post-terminal noise)"
    )
    fleet = simulate(
        FleetConfig(
            runs=args.runs,
            seed=args.seed,
            duplicates=0.03,
            reorder_window=3,
            post_terminal=0.02,
            conflicting_terminals=0.01,
            malformed=0.005,
            oversized=0.001,
        )
    )
    write_manifest(fleet, demo_dir / "manifest.json")
    asyncio.run(ensure_topics(settings))
    asyncio.run(
        publish_to_kafka(
            fleet,
            settings.kafka_bootstrap_servers,
            settings.topics.input,
            progress=sys.stderr.isatty(),
        )
    )
    print(f"      published {len(fleet.records):,} records to {settings.topics.input}")
    print("[3/5] running the worker until it has drained the topic")
    started = time.monotonic()
    with WorkerProcess(worker_env(settings), log_path=demo_dir / "worker.log") as worker:
        worker.wait_drained(settings.topics.input, settings.consumer_group, timeout=600, settle=4.0)
    print(f"      drained in {time.monotonic() - started:.1f}s (log: {demo_dir / 'worker.log'})")

    from prism import sinks

    client = sinks.connect(settings.clickhouse_dsn, settings.clickhouse_database)
    print(f"[4/5] report from the ledger {settings.clickhouse_dsn}")
    print(report(client, settings.clickhouse_database))
    problems = check(client, settings.clickhouse_database, fleet.manifest)
    print(
        "\nGround truth: "
        + (
            "the ledger matches the simulator's manifest"
            if not problems
            else "MISMATCH\n  " + "\n  ".join(problems)
        )
    )
    from prism.dashboards import build_all

    written = build_all()
    print(f"[5/5] wrote {len(written)} Grafana files under dashboards/ (docker compose up grafana)")
    print(
        f"\nExplore: .venv/bin/prism-pipeline query --clickhouse {settings.clickhouse_dsn} "
        '"SELECT status, count() FROM prism.runs GROUP BY status"'
    )
    print(f"Stop the broker: make kafka-down   (topics of this demo: {prefix}.*)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
