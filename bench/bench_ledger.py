"""Ledger benchmark: writer rows/s, the billing query and a run-timeline lookup on chDB.

A synthetic fleet (1M usage rows and 1M raw events; quick mode 100k each, plus the runs
and turns of those runs) goes through ``LedgerWriter`` into a fresh chDB database under a
temporary path, spread over two calendar months in time order (a third of the runs use a
model that only estimates usage, and each of those has one estimate superseded by a
reported row). Then the first billing report of the previous month (``billing_first_ms``:
it refreshes the month's day rollup, sinks/_rollup.py), and 50 times each: the billing
report for the previous month, all tenants and one tenant; the same from the rows alone
(``*_rows``, ``rollup=False``: the reference, what every report read before the rollup);
``run_timeline`` for a random run; and the billing report again once the month's parts are
merged (as a past month's are). Targets: p95 <= 100 ms for both queries.

chDB hosts one engine per process, so ``run()`` does the work in a child process.
Run: ``.venv/bin/python -m bench.bench_ledger [--quick]``.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from bench._child import run_child

BENCH = "ledger"
REPEATS = 50
TURNS_PER_RUN = 9  # provider_turn usage rows and turn events per run, plus run_total/start/end
TENANTS = 20
MODELS = [("anthropic", "claude-sonnet-4-5"), ("openai", "gpt-4.1"), ("ollama", "llama3.1:70b")]


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Run the benchmark in a child process (its own chDB engine) and return its rows."""
    return run_child("bench.bench_ledger", *(["--quick"] if quick else []))


def _row(metric: str, value: float, unit: str) -> dict[str, Any]:
    return {"bench": BENCH, "metric": metric, "value": round(value, 3), "unit": unit}


def _months(now: datetime) -> tuple[datetime, datetime, datetime]:
    """Start of the previous month, start of this month, start of next month (UTC)."""
    this = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    prev = (this - timedelta(days=1)).replace(day=1)
    nxt = (this + timedelta(days=32)).replace(day=1)
    return prev, this, nxt


def _batches(n_runs: int, start: datetime, span_s: float, per_batch: int, seed: int = 7):
    """Yield LedgerBatches of ``per_batch`` runs each: run, turns, usage and raw events."""
    from prism.schemas import LedgerBatch, RawEventRow, RunRow, TurnRow, UsageRow

    rng = random.Random(seed)
    cost = Decimal("0.000003")
    batch = LedgerBatch()
    for i in range(n_runs):
        run_id = f"run-{i:08d}"
        tenant = f"tenant-{rng.randrange(TENANTS):02d}"
        provider, model = MODELS[i % len(MODELS)]
        estimated = provider == "ollama"
        # runs start in time order, as a live pipeline writes them
        t = start + timedelta(seconds=(i + rng.random()) * span_s / n_runs)
        events = [("agent_started", t)]
        total_in = 0
        for turn in range(1, TURNS_PER_RUN + 1):
            ts = t + timedelta(seconds=turn)
            seq = len(events)
            tin, tout = 1000 + rng.randrange(4000), 50 + rng.randrange(500)
            total_in += tin
            cr = None if estimated else rng.randrange(tin)
            batch.turns.append(TurnRow(
                run_id, "model", turn, 1, tenant, provider, model, seq, ts, "end_turn", 800.0,
                None, 3, "h", tin, tout, tin + tout, cr, None, None,
                "estimated" if estimated else "reported", "medium" if estimated else None,
                None, None, None, None, 1,
            ))  # fmt: skip
            events.append(("provider_turn_finished", ts))
            batch.usage.append(UsageRow(
                f"{run_id}-u{turn}", run_id, seq, tenant, None, provider, model,
                "provider_turn", turn, 1, None, tin, tout, tin + tout, cr, None,
                None if estimated else cost * tin, None if estimated else "USD", estimated,
                "medium" if estimated else None, ts,
            ))  # fmt: skip
            if estimated and turn == 1:  # a late reported row supersedes this estimate
                # as the core does: re-emit the estimate superseded, with a higher version
                batch.usage.append(replace(batch.usage[-1], superseded=True, version=2))
                batch.usage.append(UsageRow(
                    f"{run_id}-r{turn}", run_id, seq, tenant, None, provider, model,
                    "provider_turn", turn, 1, None, tin, tout, tin + tout, None, None,
                    cost * tin, "USD", False, None, ts,
                ))  # fmt: skip
        end = t + timedelta(seconds=TURNS_PER_RUN + 1)
        events.append(("agent_finished", end))
        last = len(events) - 1
        batch.usage.append(UsageRow(
            f"{run_id}-total", run_id, last, tenant, None, provider, model, "run_total", None,
            None, None, total_in, None, None, None, None, None, None, estimated, None, end,
        ))  # fmt: skip
        batch.events.extend(
            RawEventRow(
                f"{run_id}-e{seq}", run_id, seq, type_, ts, tenant, None, None, None, "agent",
                provider, model, None, None, '{"turn":1}', None, "bench", 0, i, ts,
            )
            for seq, (type_, ts) in enumerate(events)
        )  # fmt: skip
        batch.runs.append(RunRow(
            run_id, tenant, None, None, None, "agent", None, provider, model, None, None, None,
            None, "succeeded", "agent_finished", last, t, end, end, None, None, "done",
            None, None, None, None, None, TURNS_PER_RUN, 0, 0, None, None, None, None, None,
            None, [], 0, False, False, len(events), last, True, "{}", 2,
        ))  # fmt: skip
        if (i + 1) % per_batch == 0 or i + 1 == n_runs:
            yield batch
            batch = LedgerBatch()


def _percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return statistics.median(ordered), p95


def _timed(cases: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    """p50/p95 in ms of each call over ``REPEATS`` runs, after one warm-up."""
    rows = []
    for name, call in cases:
        call()
        samples = []
        for _ in range(REPEATS):
            t0 = time.perf_counter()
            result = call()
            samples.append((time.perf_counter() - t0) * 1000)
            assert result, f"{name} returned nothing"
        p50, p95 = _percentiles(samples)
        rows.append(_row(f"{name}_p50", p50, "ms"))
        rows.append(_row(f"{name}_p95", p95, "ms"))
    return rows


def _child(quick: bool) -> list[dict[str, Any]]:
    from prism.sinks import (
        LedgerWriter,
        SourceRange,
        billing_report,
        connect,
        migrate,
        run_timeline,
    )

    target_usage = 100_000 if quick else 1_000_000
    n_runs = target_usage // (TURNS_PER_RUN + 1)
    prev, this, nxt = _months(datetime.now(UTC))
    span_s = (nxt - prev).total_seconds() - 3600
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-ledger-") as tmp:
        client = connect(f"chdb://{tmp}/ledger", "bench")
        migrate(client, "bench", raw_event_ttl_days=3650)
        writer = LedgerWriter(client, "bench", max_rows=400_000, max_seconds=3600)
        gen_s = write_s = 0.0
        counts = {"usage": 0, "events": 0, "total": 0}
        t_gen = time.perf_counter()
        offset = 0
        for batch in _batches(n_runs, prev, span_s, per_batch=5_000):
            t_add = time.perf_counter()
            gen_s += t_add - t_gen
            counts["usage"] += len(batch.usage)
            counts["events"] += len(batch.events)
            counts["total"] += len(batch)
            writer.add(batch, SourceRange("bench", 0, offset, offset + len(batch.runs) - 1))
            offset += len(batch.runs)
            if writer.should_flush():
                writer.flush()
            t_gen = time.perf_counter()
            write_s += t_gen - t_add
        t_add = time.perf_counter()
        writer.flush()
        write_s += time.perf_counter() - t_add
        rows.append(_row("usage_rows", counts["usage"], "rows"))
        rows.append(_row("event_rows", counts["events"], "rows"))
        rows.append(_row("writer_rows_per_s", counts["total"] / write_s, "rows/s"))
        rows.append(_row("writer_total_rows", counts["total"], "rows"))
        rows.append(_row("generate_rows_per_s", counts["total"] / gen_s, "rows/s"))

        rng = random.Random(11)

        def billing_all() -> Any:
            return billing_report(client, "bench", prev, this)

        def billing_one() -> Any:
            tenant = f"tenant-{rng.randrange(TENANTS):02d}"
            return billing_report(client, "bench", prev, this, tenant=tenant)

        def timeline() -> Any:
            return run_timeline(client, "bench", f"run-{rng.randrange(n_runs):08d}")

        def rows_all() -> Any:
            return billing_report(client, "bench", prev, this, rollup=False)

        def rows_one() -> Any:
            tenant = f"tenant-{rng.randrange(TENANTS):02d}"
            return billing_report(client, "bench", prev, this, tenant=tenant, rollup=False)

        t0 = time.perf_counter()
        first = billing_all()
        rows.append(_row("billing_first_ms", (time.perf_counter() - t0) * 1000, "ms"))
        assert first == rows_all(), "the rollup's report differs from the rows' report"
        cases = [
            ("billing_month_all_tenants", billing_all),
            ("billing_month_one_tenant", billing_one),
            ("run_timeline", timeline),
            ("billing_month_all_tenants_rows", rows_all),
            ("billing_month_one_tenant_rows", rows_one),
        ]
        rows += _timed(cases)
        # A past month's usage is normally merged by then: measure billing on merged parts too.
        client.command("OPTIMIZE TABLE bench.usage_store FINAL")
        rows += _timed([(f"{name}_merged", call) for name, call in cases[:2]])
        client.close()
    return rows


def main(argv: list[str]) -> None:
    quick = "--quick" in argv
    if "--child" in argv:
        print(json.dumps(_child(quick)))
        return
    for row in run(quick):
        print(f"{row['bench']:8} {row['metric']:34} {row['value']:>14,.3f} {row['unit']}")


if __name__ == "__main__":
    main(sys.argv[1:])
