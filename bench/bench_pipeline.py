"""Pipeline benchmark: the bare Python baseline against the worker, then the worker's freshness.

One local broker (free port, temporary directory, stopped at the end even on error) and
one simulated fleet without chaos (~200k events; quick: ~30k), published once to a
4-partition topic. On that topic, one after the other:

- ``baseline``: ``bench._baseline`` in a child process (aiokafka ``getmany`` -> ``orjson``
  -> clickhouse-connect inserts of ~5,000 rows into a chDB raw-events table), timed from
  the first record consumed to the last insert acknowledged; peak and end RSS of the child.
- ``worker``: ``prism-pipeline worker`` (``WorkerProcess``; fresh group, fresh chDB path,
  fresh state folder). Events/s come from its ``worker-stats.json``: the span between the
  first and the last batch covers all batches but one, so the rate is
  ``events * (batches - 1) / batches / (last_batch_at - first_batch_at)``. Without a
  stats file, from committed offsets sampled every 0.5 s. Peak RSS is the worker's
  ``VmHWM`` and end RSS its ``VmRSS``, both just before it is stopped.
- ``machinery``: the same worker with its core taken out (``bench._machinery``: per
  record the bare loop's parse and one raw row, stored and committed as the worker does;
  fresh group, ledger and state folder), timed like ``worker``: what the worker's fetch,
  store and transactions cost without run semantics, as ``machinery_events_per_s`` and
  ``machinery_vs_baseline``.
- ``ingest``: the same fleet as a JSONL file through ``prism-pipeline ingest-file`` in a
  child process (``bench.bench_ingest``): events over the command's wall time, and its
  peak RSS, beside the worker's. It needs no broker.
- ``freshness``: at each offered rate (default 5,000 and 10,000 events/s), a fresh topic
  and a fresh worker; after a warm-up of a few records, records of the same fleet
  re-stamped with ``ts`` = now (``bench._load``) are offered at that rate for 30 s (quick:
  10 s); p50/p90/p99 freshness (now minus event ``ts`` when its row is acknowledged by
  ClickHouse) come from the worker's stats file, as rows ``freshness_<rate>_<figure>``;
  the worker's RSS after the warm-up (``_worker_idle_rss``, the floor the load adds to), its
  peak and its end RSS beside them.

Example::

    rows, errors = measure(quick=True, parts=("baseline", "worker"))

Run: ``.venv/bin/python -m bench.bench_pipeline [--quick]`` (all benchmarks: ``python -m bench``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import math
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_RATES", "PARTS", "measure", "peak_rss_kib", "read_stats", "run", "stats_rate"]

BENCH = "pipeline"
PARTS = ("baseline", "worker", "machinery", "ingest", "freshness")
KAFKA_PARTS = ("baseline", "worker", "machinery", "freshness")  # the parts that need the broker
DEFAULT_RATES = (5000.0, 10000.0)  # events/s offered in turn in the freshness part
EVENTS_FULL, EVENTS_QUICK = 200_000, 30_000
FRESHNESS_SECONDS_FULL, FRESHNESS_SECONDS_QUICK = 30.0, 10.0
EVENTS_PER_RUN = 14.3  # mean events per run of the simulator's scenario mix without chaos
SEED = 20261130
WARMUP_RECORDS = 20
STATS_FILE = "worker-stats.json"

Log = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def _row(metric: str, value: float, unit: str) -> dict[str, Any]:
    return {"bench": BENCH, "metric": metric, "value": round(float(value), 3), "unit": unit}


def read_stats(state_dir: Path) -> dict[str, Any] | None:
    """The worker's ``worker-stats.json`` under ``state_dir``; None if absent or unreadable."""
    try:
        doc = json.loads((state_dir / STATS_FILE).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def stats_rate(stats: dict[str, Any]) -> float | None:
    """Events/s of a drained backlog from a stats file; None with fewer than two batches."""
    first, last = stats.get("first_batch_at"), stats.get("last_batch_at")
    events, batches = int(stats.get("events") or 0), int(stats.get("batches") or 0)
    if first is None or last is None or batches < 2 or last <= first:
        return None
    return float(events * (batches - 1) / batches / (last - first))


def peak_rss_kib(pid: int, field: str = "VmHWM") -> int | None:
    """``VmHWM`` (peak resident set) of a live process in KiB, or another ``/proc/<pid>/status``
    field (``VmRSS``: the resident set now); None if unreadable."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _settings(bootstrap: str, name: str, root: Path, topics: str | None = None) -> Any:
    """A worker's settings: its own group, ledger and state folder under ``root / name``,
    on the topics of ``bench-<topics or name>``."""
    from prism.pipeline.settings import load_settings

    (root / name).mkdir(parents=True, exist_ok=True)  # a chDB path's parent must exist
    return load_settings(
        kafka_bootstrap_servers=bootstrap,
        topic_prefix=f"bench-{topics or name}",
        consumer_group=f"bench-{name}-{int(time.time())}",
        clickhouse_dsn=f"chdb://{root / name / 'ledger'}",
        state_dir=root / name / "state",
    )


class _Worker:
    """A worker subprocess plus what the benchmark reads from it (stats file, offsets, RSS)."""

    def __init__(self, settings: Any, log_path: Path, *, machinery: bool = False) -> None:
        from prism.devstack.workerproc import WorkerProcess
        from prism.pipeline.topics import worker_env

        self.settings = settings
        process = WorkerProcess
        if machinery:  # the same worker, its core taken out
            from bench._machinery import MachineryProcess as process
        self.proc = process(worker_env(settings), log_path=log_path)

    def __enter__(self) -> _Worker:
        self.proc.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.stop()

    def stats(self) -> dict[str, Any] | None:
        return read_stats(self.settings.state_dir)

    def _committed(self) -> int:
        from prism.devstack.workerproc import committed_lag

        s = self.settings
        try:
            lag, total = committed_lag(s.kafka_bootstrap_servers, s.consumer_group, s.topics.input)
        except Exception:  # the group does not exist before its first commit
            return 0
        return total - lag

    def wait_consumed(self, n: int, *, stall: float = 90.0) -> tuple[float, int] | None:
        """Wait until the worker consumed ``n`` records (its stats file or its commits say so).

        Fails when the worker exits, or when neither figure moved for ``stall`` seconds.
        Returns ``(seconds, records)`` committed between the first sample that saw a commit
        and the one that saw all ``n`` (the rate when there is no stats file), or None.
        """
        first: tuple[float, int] | None = None
        best, moved = -1, time.monotonic()
        committed, polled = 0, 0.0
        while True:
            if not self.proc.running:
                code = self.proc.proc.returncode if self.proc.proc else None
                raise RuntimeError(
                    f"the worker exited with {code}; log {self.proc.log_path}:\n"
                    f"{self.proc.tail_log()}"
                )
            stats = self.stats()
            seen = int(stats.get("events") or 0) if stats else 0
            now = time.monotonic()
            if stats is None or now - polled >= 2.0:  # each poll costs the broker and this CPU
                committed, polled = self._committed(), now
            if first is None and committed > 0:
                first = (now, committed)
            if seen >= n or committed >= n:
                if first is not None and committed > first[1]:
                    return now - first[0], committed - first[1]
                return None
            if max(seen, committed) > best:
                best, moved = max(seen, committed), now
            elif now - moved > stall:
                raise TimeoutError(
                    f"the worker made no progress for {stall:.0f}s at {best:,} of {n:,} records "
                    f"of {self.settings.topics.input}; log {self.proc.log_path}:\n"
                    f"{self.proc.tail_log()}"
                )
            time.sleep(0.5)

    def rss_kib(self, field: str = "VmRSS") -> int | None:
        """The worker's resident set now (or ``field`` of its ``/proc`` status) in KiB."""
        pid = self.proc.proc.pid if self.proc.proc else None
        return peak_rss_kib(pid, field) if pid else None

    def stop(self) -> tuple[dict[str, Any] | None, int | None]:
        """Stop the worker (it writes its stats at shutdown); (final stats, peak RSS in KiB).
        ``end_rss_kib`` keeps its resident set just before the stop."""
        rss = self.rss_kib("VmHWM")
        self.end_rss_kib = self.rss_kib("VmRSS")
        self.proc.stop()
        stats = self.stats()
        if stats is not None:  # kept next to the worker's log
            self.proc.log_path.with_suffix(".stats.json").write_text(json.dumps(stats, indent=1))
        return stats, rss


def _publish_fleet(target: int, settings: Any, log: Log, *, publish: bool) -> list[bytes]:
    """Simulate ~``target`` events without chaos, publish them if asked; the record values."""
    from prism.pipeline.topics import ensure_topics
    from prism.runtime.simulator import FleetConfig, publish_to_kafka, simulate

    runs = max(1, math.ceil(target / EVENTS_PER_RUN))
    t0 = time.perf_counter()
    fleet = simulate(FleetConfig(runs=runs, seed=SEED))
    log(f"fleet: {runs:,} runs, {len(fleet.records):,} events in {time.perf_counter() - t0:.1f}s")
    if publish:
        asyncio.run(ensure_topics(settings))
        fleet = dataclasses.replace(fleet, events=[], manifest={})
        report = asyncio.run(
            publish_to_kafka(
                fleet, settings.kafka_bootstrap_servers, settings.topics.input, progress=False
            )
        )
        log(f"fleet: published to {settings.topics.input} in {report.seconds:.1f}s")
    return [r.value for r in fleet.records]


def _baseline(settings: Any, events: int, root: Path, log: Log) -> list[dict[str, Any]]:
    cmd = [
        sys.executable,
        "-m",
        "bench._baseline",
        "--bootstrap",
        settings.kafka_bootstrap_servers,
        "--topic",
        settings.topics.input,
        "--events",
        str(events),
        "--chdb",
        str(root / "baseline" / "ledger"),
    ]
    (root / "baseline").mkdir(parents=True, exist_ok=True)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the baseline child failed ({done.returncode}):\n{done.stderr[-3000:]}")
    res = json.loads(done.stdout.strip().splitlines()[-1])
    log(
        f"baseline: {res['events']:,} events in {res['seconds']:.2f}s "
        f"({res['events_per_s']:,.0f}/s, {res['inserts']} inserts)"
    )
    rows = [
        _row("baseline_events_per_s", res["events_per_s"], "events/s"),
        _row("baseline_peak_rss", res["peak_rss_kib"] / 1024, "MiB"),
    ]
    if res.get("end_rss_kib"):
        rows.append(_row("baseline_end_rss", res["end_rss_kib"] / 1024, "MiB"))
    return rows


def _worker(
    settings: Any, events: int, logs: Path, log: Log, *, machinery: bool = False
) -> list[dict[str, Any]]:
    """The worker's rows over the backlog (``machinery``: ``bench._machinery``'s, named
    ``machinery_*``: its rate, peak RSS and ``machinery_stage_<name>`` rows)."""
    started = time.time()
    name = "machinery" if machinery else "worker"
    with _Worker(settings, logs / f"{name}-throughput.log", machinery=machinery) as w:
        fallback = w.wait_consumed(events)
        stats, rss = w.stop()
        end = w.end_rss_kib
    rate = stats_rate(stats) if stats else None
    if rate is None and fallback is not None:
        rate = fallback[1] / fallback[0]
    if rate is None:
        raise RuntimeError(f"no worker rate: stats file {stats!r}, offsets sample {fallback!r}")
    source = "stats file" if stats else "committed offsets"
    log(
        f"{name}: {events:,} events at {rate:,.0f}/s (from the {source}), peak RSS "
        f"{(rss or 0) / 1024:.0f} MiB, end {(end or 0) / 1024:.0f} MiB"
    )
    if machinery:  # its rate, peak and stages (JSON rows): what the core adds is the rest
        rows = [_row("machinery_events_per_s", rate, "events/s")]
        if rss is not None:
            rows.append(_row("machinery_peak_rss", rss / 1024, "MiB"))
        stages = stage_rows(stats) if stats else []
        return rows + [
            {**r, "metric": "machinery_" + r["metric"].removeprefix("worker_")} for r in stages
        ]
    from prism.pipeline import core  # the worker inherits PRISM_CORE: the same build

    rows = [_row("worker_events_per_s", rate, "events/s")]
    rows.append(_row("worker_core_compiled", int(core.COMPILED), "bool"))
    if rss is not None:
        rows.append(_row("worker_peak_rss", rss / 1024, "MiB"))
    if end is not None:
        rows.append(_row("worker_end_rss", end / 1024, "MiB"))
    if stats:
        if stats.get("first_batch_at"):
            rows.append(_row("worker_startup", stats["first_batch_at"] - started, "s"))
        for key, unit in (("insert_ms", "ms"), ("batch_size", "events")):
            for q in ("p50", "p99"):
                if q in (stats.get(key) or {}):
                    rows.append(_row(f"worker_{key.removesuffix('_ms')}_{q}", stats[key][q], unit))
        rows += stage_rows(stats)
    return rows


def _machinery(
    bootstrap: str, events: int, root: Path, logs: Path, log: Log
) -> list[dict[str, Any]]:
    """``_worker``'s measure of ``bench._machinery`` over the worker's backlog (the same
    topic; its own group, ledger and state folder)."""
    settings = _settings(bootstrap, "machinery", root, topics="throughput")
    return _worker(settings, events, logs, log, machinery=True)


def stage_rows(stats: dict[str, Any]) -> list[dict[str, Any]]:
    """``worker_stage_<name>`` rows (us/event) from a stats file's ``stage_us``: where the
    worker's own time went, beside ``stages``' figures for the same work without Kafka."""
    stages = stats.get("stage_us") or {}
    return [_row(f"worker_stage_{name}", float(us), "us/event") for name, us in stages.items()]


def freshness_prefix(rate: float) -> str:
    """The row names' prefix of the freshness figures at ``rate`` events/s offered."""
    return f"freshness_{rate:.0f}"


def _freshness(
    values: Sequence[bytes],
    bootstrap: str,
    root: Path,
    rate: float,
    seconds: float,
    logs: Path,
    log: Log,
) -> list[dict[str, Any]]:
    """The freshness part at one rate, on a topic and a worker of its own."""
    from bench._load import offer_load
    from prism.pipeline.topics import ensure_topics

    name = freshness_prefix(rate)
    settings = _settings(bootstrap, name.replace("_", "-"), root)
    boot, topic = settings.kafka_bootstrap_servers, settings.topics.input
    asyncio.run(ensure_topics(settings))
    with _Worker(settings, logs / f"worker-{name}.log") as w:
        asyncio.run(
            offer_load(values, boot, topic, rate=1000, count=WARMUP_RECORDS, first_tag="-warmup")
        )
        w.wait_consumed(WARMUP_RECORDS)
        idle = w.rss_kib()  # started, warmed up, no load yet: the floor the load adds to
        log(
            f"freshness: worker ready ({(idle or 0) / 1024:.0f} MiB); offering "
            f"{rate:,.0f} events/s for {seconds:.0f}s"
        )
        load = asyncio.run(offer_load(values, boot, topic, rate=rate, count=int(rate * seconds)))
        w.wait_consumed(WARMUP_RECORDS + load.records)
        stats, rss = w.stop()
        end = w.end_rss_kib
    fresh = (stats or {}).get("freshness_ms") or {}
    if "p99" not in fresh:
        raise RuntimeError(f"the worker's stats file has no freshness figures: {stats!r}")
    log(
        f"freshness: p50 {fresh['p50']:.0f} ms, p99 {fresh['p99']:.0f} ms over "
        f"{fresh.get('count', 0):,} rows at {load.rate:,.0f} events/s offered"
    )
    rows = [_row(f"{name}_offered_rate", load.rate, "events/s")]
    rows += [
        _row(f"{name}_{q}", fresh[q], "ms") for q in ("p50", "p90", "p99", "max") if q in fresh
    ]
    rows.append(_row(f"{name}_rows", fresh.get("count", 0), "rows"))
    for metric, kib in (("idle", idle), ("peak", rss), ("end", end)):
        if kib is not None:
            rows.append(_row(f"{name}_worker_{metric}_rss", kib / 1024, "MiB"))
    return rows


def measure(
    quick: bool = False,
    *,
    events: int | None = None,
    rates: Sequence[float] = DEFAULT_RATES,
    parts: Sequence[str] = PARTS,
    log_dir: Path | None = None,
    log: Log = _stderr,
) -> tuple[list[dict[str, Any]], list[str]]:
    """Run the chosen ``parts`` on one broker and one fleet; (rows, error messages).

    ``log_dir`` keeps the workers' logs (default: the temporary folder, removed at the
    end). A failing part is reported and the others still run; the broker always stops.
    """
    from bench.bench_ingest import measure_ingest
    from prism.devstack import LocalKafka, free_port

    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        raise ValueError(f"unknown pipeline benchmark part(s) {unknown}; choose from {PARTS}")
    target = events or (EVENTS_QUICK if quick else EVENTS_FULL)
    seconds = FRESHNESS_SECONDS_QUICK if quick else FRESHNESS_SECONDS_FULL
    rows: list[dict[str, Any]] = []
    errors: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-pipeline-") as tmp:
        root = Path(tmp)
        logs = log_dir or root
        logs.mkdir(parents=True, exist_ok=True)
        broker = LocalKafka(state_dir=root / "kafka", port=free_port())
        kafka = any(p in KAFKA_PARTS for p in parts)
        t0 = time.perf_counter()
        try:
            if kafka:
                broker.up()
                log(f"broker up at {broker.bootstrap} in {time.perf_counter() - t0:.1f}s")
            throughput = _settings(broker.bootstrap, "throughput", root)
            publish = any(p in parts for p in ("baseline", "worker", "machinery"))
            values = _publish_fleet(target, throughput, log, publish=publish)
            rows.append(_row("fleet_events", len(values), "events"))
            # (part, its name in an error message, the step)
            steps: list[tuple[str, str, Callable[[], list[dict[str, Any]]]]] = [
                ("baseline", "baseline", lambda: _baseline(throughput, len(values), root, log)),
                ("worker", "worker", lambda: _worker(throughput, len(values), logs, log)),
                (
                    "machinery",
                    "worker without its core",
                    lambda: _machinery(broker.bootstrap, len(values), root, logs, log),
                ),
                ("ingest", "ingest-file", lambda: measure_ingest(values, root, logs, log)),
            ]
            steps += [
                ("freshness", f"freshness at {rate:,.0f} events/s",
                 functools.partial(_freshness, values, broker.bootstrap, root, rate, seconds,
                                   logs, log))
                for rate in rates
            ]  # fmt: skip
            for part, name, step in steps:
                if part not in parts:
                    continue
                try:
                    rows += step()
                except Exception as exc:  # one broken part must not hide the others
                    errors.append(f"pipeline/{name}: {type(exc).__name__}: {exc}")
                    log(errors[-1])
        finally:
            if kafka:
                broker.down()
    figures = {r["metric"]: r["value"] for r in rows}
    for who in ("worker", "machinery"):
        if "baseline_events_per_s" in figures and f"{who}_events_per_s" in figures:
            ratio = 100 * figures[f"{who}_events_per_s"] / figures["baseline_events_per_s"]
            at = 1 + next(i for i, r in enumerate(rows) if r["metric"] == f"{who}_events_per_s")
            rows.insert(at, _row(f"{who}_vs_baseline", ratio, "%"))
    return rows, errors


def run(quick: bool = False) -> list[dict[str, Any]]:
    """All parts with the defaults; raise ``RuntimeError`` if any part failed."""
    rows, errors = measure(quick)
    if errors:
        raise RuntimeError("; ".join(errors))
    return rows


if __name__ == "__main__":
    from bench._cli import parser, print_rows

    print_rows(run(quick=parser("bench_pipeline", __doc__, ["", "--quick"]).parse_args().quick))
