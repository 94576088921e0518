"""Scale-out benchmark: events/s of 1, 2 and 3 worker processes in one group on 12 partitions.

One local broker (free port, temporary directory, stopped at the end even on error) and one
simulated fleet without chaos (~120k events; quick: ~30k) published once to a
12-partition topic. Then, one after the other so they never compete, for n = 1, 2, 3: a
fresh consumer group of n ``prism-pipeline worker`` processes (``WorkerProcess``; each its
own chDB path and state folder, as separate hosts would have) started together on that
topic. Progress is read from Kafka: the group's committed offsets and its stable members,
sampled every 0.5 s. The rate counts only the time all n processes work: from the first
sample that sees the group stable with n members to the one that sees every record
committed, ``events/s = records committed in that window / its seconds``. Startup and the
rebalances while processes join are excluded (``scaleout_<n>w_stable_after`` reports when
the group settled). ``scaleout_<n>w_speedup`` is the rate over the one-process rate.

On one box every process competes for the same cores: the figures say how the pipeline
grows until the CPU is the limit, not how it grows across machines.

Example::

    rows, errors = measure(quick=True, counts=(1, 2))

Run: ``.venv/bin/python -m bench.bench_scaleout [--quick]`` (in the suite:
``python -m bench --only scaleout``).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["COUNTS", "PARTITIONS", "measure", "run"]

BENCH = "scaleout"
COUNTS = (1, 2, 3)
PARTITIONS = 12
EVENTS_FULL, EVENTS_QUICK = 120_000, 30_000
SAMPLE_SECONDS = 0.5

Log = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def _row(metric: str, value: float, unit: str) -> dict[str, Any]:
    return {"bench": BENCH, "metric": metric, "value": round(float(value), 3), "unit": unit}


def _settings(bootstrap: str, root: Path, name: str, group: str) -> Any:
    from prism.pipeline.settings import load_settings

    (root / name).mkdir(parents=True, exist_ok=True)  # a chDB path's parent must exist
    return load_settings(
        kafka_bootstrap_servers=bootstrap,
        topic_prefix="bench-scaleout",
        partitions=PARTITIONS,
        consumer_group=group,
        clickhouse_dsn=f"chdb://{root / name / 'ledger'}",
        state_dir=root / name / "state",
    )


def _sample(settings: Any) -> tuple[int, int, int]:
    """(records committed by the group, records on the topic, stable members)."""
    from prism.devstack.workerproc import committed_lag, group_members

    s = settings
    try:
        lag, total = committed_lag(s.kafka_bootstrap_servers, s.consumer_group, s.topics.input)
    except Exception:  # the group has not committed yet
        lag, total = -1, -1
    try:
        members = group_members(s.kafka_bootstrap_servers, s.consumer_group)
    except Exception:
        members = 0
    return (total - lag if lag >= 0 else 0), total, members


def _run_group(
    n: int, bootstrap: str, root: Path, events: int, logs: Path, log: Log
) -> tuple[float, float]:
    """(events/s while all ``n`` processes are members, seconds until the group settled)."""
    from bench.bench_pipeline import read_stats
    from prism.devstack.workerproc import WorkerProcess
    from prism.pipeline.topics import worker_env

    group = f"bench-scaleout-{n}w-{int(time.time())}"
    workers = [
        WorkerProcess(
            worker_env(_settings(bootstrap, root, f"{n}w-{i}", group)),
            log_path=logs / f"worker-scaleout-{n}w-{i}.log",
        )
        for i in range(n)
    ]
    probe = _settings(bootstrap, root, f"{n}w-0", group)
    started = time.monotonic()
    window: tuple[float, int] | None = None
    try:
        for w in workers:
            w.start()
        moved, best = time.monotonic(), -1
        while True:
            for w in workers:
                if not w.running:
                    raise RuntimeError(f"a worker exited; log {w.log_path}:\n{w.tail_log()}")
            done, total, members = _sample(probe)
            now = time.monotonic()
            if window is None and members == n:
                window = (now, done)
                log(f"{n} worker(s): group stable after {now - started:.1f}s at {done:,} records")
            if total >= events and done >= total:
                break
            if done > best:
                best, moved = done, now
            elif now - moved > 120:
                raise TimeoutError(f"{n} worker(s) made no progress for 120s at {done:,} records")
            time.sleep(SAMPLE_SECONDS)
    finally:
        for w in workers:
            w.stop()
            stats = read_stats(Path(w.env["PRISM_STATE_DIR"]))
            if stats is not None:  # kept next to the worker's log
                w.log_path.with_suffix(".stats.json").write_text(json.dumps(stats, indent=1))
    if window is None or done - window[1] <= 0 or now <= window[0]:
        raise RuntimeError(
            f"the topic was drained before all {n} worker(s) joined the group; "
            "use a larger fleet (--events)"
        )
    rate = (done - window[1]) / (now - window[0])
    log(f"{n} worker(s): {done - window[1]:,} records in {now - window[0]:.1f}s = {rate:,.0f}/s")
    return rate, window[0] - started


def measure(
    quick: bool = False,
    *,
    events: int | None = None,
    counts: Sequence[int] = COUNTS,
    log_dir: Path | None = None,
    log: Log = _stderr,
) -> tuple[list[dict[str, Any]], list[str]]:
    """Run each process count in ``counts`` on one broker and one fleet; (rows, errors)."""
    from bench.bench_pipeline import _publish_fleet
    from prism.devstack import LocalKafka, free_port

    target = events or (EVENTS_QUICK if quick else EVENTS_FULL)
    rows: list[dict[str, Any]] = []
    errors: list[str] = []
    rates: dict[int, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-scaleout-") as tmp:
        root = Path(tmp)
        logs = log_dir or root
        logs.mkdir(parents=True, exist_ok=True)
        broker = LocalKafka(state_dir=root / "kafka", port=free_port())
        try:
            broker.up()
            fleet_settings = _settings(broker.bootstrap, root, "publish", "unused")
            values = _publish_fleet(target, fleet_settings, log, publish=True)
            rows.append(_row("fleet_events", len(values), "events"))
            for n in counts:
                try:
                    rate, settled = _run_group(n, broker.bootstrap, root, len(values), logs, log)
                except Exception as exc:  # one count failing must not hide the others
                    errors.append(f"scaleout/{n}w: {type(exc).__name__}: {exc}")
                    log(errors[-1])
                    continue
                rates[n] = rate
                rows.append(_row(f"scaleout_{n}w_events_per_s", rate, "events/s"))
                rows.append(_row(f"scaleout_{n}w_stable_after", settled, "s"))
        finally:
            broker.down()
    for n, rate in rates.items():
        if n != 1 and 1 in rates:
            rows.append(_row(f"scaleout_{n}w_speedup", rate / rates[1], "x"))
    return rows, errors


def run(quick: bool = False) -> list[dict[str, Any]]:
    """1, 2 and 3 processes with the defaults; raise ``RuntimeError`` if any count failed."""
    rows, errors = measure(quick)
    if errors:
        raise RuntimeError("; ".join(errors))
    return rows


if __name__ == "__main__":
    from bench._cli import parser, print_rows

    print_rows(run(quick=parser("bench_scaleout", __doc__, ["", "--quick"]).parse_args().quick))
