"""Stage benchmark: where the worker's time per event goes, without Kafka in the way.

The same simulated fleet as the pipeline benchmark (seed 20261130, no chaos; 100k events,
quick 30k) keyed over 4 partitions goes through the worker's store step in batches of
20,000 events (the worker's default) as it takes them: ``Intake.step`` per partition, then
``LedgerStore`` -> ``LedgerWriter`` -> chDB, then ``Intake.commit``, with the worker's GC
policy (``GcPolicy.batch``). Each stage is timed where it runs:

- ``parse``: the intake's parse of the batch's values (``schemas.parse_fast_batch``),
  called just before the step through ``Intake.parse_ahead``, as ``ingest-file`` does;
  nothing in the intake is replaced, so a compiled core (``make compile``) is timed alike;
- ``core``: ``Intake.step`` taking those parsed values (run semantics, rows, state, outputs);
- ``columns``: the writer's cut (rows to columns, the dedup hash of each table's chunk);
- ``insert.<table>``: each ClickHouse INSERT until acknowledged (insert hook); a chDB
  ledger inserts a flush's tables at once, so these overlap, and ``insert_total`` is the
  flushes' wall time less ``columns``;
- ``gc``: collector pauses anywhere in the loop (``gc.callbacks``), also counted in the
  stage they interrupt.

Figures are microseconds per event, from the total over the whole fleet; ``stages_events_per_s``
is the loop's rate, ``stages_peak_rss`` the child's peak RSS, ``stages_rss_start`` its RSS
before the first batch and ``stages_rss_<q>`` after each quarter of the fleet (flat when
memory does not grow with the events seen); ``stages_engine_start``/``_end`` is what the
chDB engine's own allocator tracks (``MemoryTracking``), its part of the RSS, and
``stages_active_parts`` the ledger's data parts at the end. ``stages_core_compiled`` (and
``core_compiled``) is 1 when the mypyc build ran, 0 for the Python source (``PRISM_CORE``).
chDB hosts one engine per process, so ``run()`` works in a child process.
Run: ``.venv/bin/python -m bench.bench_stages [--quick] [--events N] [--batch N]
[--tracemalloc]``.

``--core-only [--events N] [--repeat R]`` (not part of ``python -m bench``) times the
intake step alone, without the ledger, in CPU time: ``core_step`` per event of the best
of R runs (default 3) over a fleet of N events (default 60,000), split into ``core_parse``
and ``core_rest``. Between two versions of the parser or the core, run it for each in
turn, a few times: its spread is a few percent where the whole loop's is 15%.

``--tracemalloc`` (not part of ``python -m bench``: tracing slows every stage several
times) says what holds the Python heap: ``traced_peak`` (the most Python objects alive
at once), ``traced_end`` (after the last batch), ``traced_last_batch`` (what freeing the
last batch's records and output gives back), ``traced_state`` (what freeing the intake,
its lanes' run state, then gives back), and ``traced_end[<file>]`` for the ten source
files whose allocations hold the most at the end. What RSS holds beyond these is native:
the chDB engine, its insert buffers, the interpreter and its modules.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import sys
import sysconfig
import tempfile
import time
import tracemalloc
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench._child import run_child

BENCH = "stages"
SEED = 20261130
EVENTS_PER_RUN = 14
PARTITIONS = 4
BATCH = 20_000  # Settings.batch_max_events' default


def run(
    quick: bool = False,
    events: int | None = None,
    *,
    batch: int | None = None,
    trace: bool = False,
) -> list[dict[str, Any]]:
    """Run the benchmark in a child process (its own chDB engine) and return its rows."""
    args = (["--quick"] if quick else []) + (["--events", str(events)] if events else [])
    args += (["--batch", str(batch)] if batch else []) + (["--tracemalloc"] if trace else [])
    return run_child("bench.bench_stages", *args)


def _row(metric: str, value: float, unit: str) -> dict[str, Any]:
    return {"bench": BENCH, "metric": metric, "value": round(value, 3), "unit": unit}


class _Timers:
    """Seconds per stage, and the GC pauses seen through ``gc.callbacks``."""

    def __init__(self, clock: Any = time.perf_counter) -> None:
        self.seconds: defaultdict[str, float] = defaultdict(float)
        self._gc_started = 0.0
        self._clock = clock

    def gc_callback(self, phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self.seconds["gc"] += time.perf_counter() - self._gc_started

    def timed(self, stage: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t = self._clock()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[stage] += self._clock() - t

        return wrapper


def keyed_records(config: Any, source: str, partitions: int = PARTITIONS) -> dict[int, list[Any]]:
    """A simulated fleet (``FleetConfig``) as the worker's input records of ``source``, keyed
    over ``partitions`` (by the sum of the key's bytes), offsets from 0 per partition."""
    from prism.pipeline.core import InRecord
    from prism.runtime.simulator import simulate

    parts: dict[int, list[Any]] = defaultdict(list)
    for rec in simulate(config).records:
        p = (sum(rec.key) if rec.key else 0) % partitions
        parts[p].append(InRecord(rec.value, source, p, len(parts[p]), rec.key, None))
    return parts


def _fleet(events: int) -> dict[int, list[Any]]:
    """The simulated fleet without chaos as the worker's input records."""
    from prism.runtime.simulator import FleetConfig

    config = FleetConfig(runs=max(1, events // EVENTS_PER_RUN), seed=SEED)
    return keyed_records(config, "bench.agent-events")


def _rss_mib() -> float:
    for line in open("/proc/self/status"):  # noqa: SIM115 - a tiny procfs read
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _engine_mib(client: Any) -> float:
    """What the chDB engine's allocator tracks (``MemoryTracking``) in MiB: its part of RSS."""
    query = "SELECT value FROM system.metrics WHERE metric = 'MemoryTracking'"
    return int(str(client.command(query))) / 2**20


def _active_parts(client: Any) -> int:
    """Active data parts over the ledger's tables (each insert makes one until merged)."""
    return int(str(client.command("SELECT count() FROM system.parts WHERE active")))


def _traced_rows(snapshot: Any, top: int = 10) -> list[dict[str, Any]]:
    """``traced_end[<file>]`` rows: the ``top`` source files holding the most (MiB)."""
    roots = (str(Path(__file__).resolve().parent.parent), sysconfig.get_paths()["stdlib"])
    rows = []
    for stat in snapshot.statistics("filename")[:top]:
        name = stat.traceback[0].filename.split("site-packages/")[-1]
        for root in roots:
            name = name.removeprefix(root + "/")
        rows.append(_row(f"traced_end[{name}]", stat.size / 2**20, "MiB"))
    return rows


def _child(
    quick: bool, events: int | None = None, batch_size: int = BATCH, trace: bool = False
) -> list[dict[str, Any]]:
    from prism import sinks
    from prism.pipeline import core
    from prism.pipeline._store import LedgerStore, open_ledger
    from prism.pipeline.core import Intake, Output
    from prism.pipeline.settings import Settings
    from prism.pipeline.worker._gc import GcPolicy

    parts = _fleet(events or (30_000 if quick else 100_000))
    total = sum(map(len, parts.values()))
    timers = _Timers()
    if trace:
        tracemalloc.start()
    traced: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="prism-bench-stages-") as tmp:
        settings = Settings.model_validate({"clickhouse_dsn": f"chdb://{tmp}/ledger"})
        client = open_ledger(settings)

        def hook(table: str, insert: Any) -> object:
            return timers.timed(f"insert.{table}", insert)()

        writer = sinks.LedgerWriter(client, settings.clickhouse_database, insert_hook=hook)
        writer._cut = timers.timed("columns", writer._cut)  # type: ignore[method-assign]
        store = LedgerStore(writer)
        intake = Intake(settings.core_config(), max_event_bytes=settings.max_event_bytes)
        parse = timers.timed("parse", intake.parse_ahead)
        policy = GcPolicy()
        per = max(1, batch_size // PARTITIONS)
        engine_start, rss_start = _engine_mib(client), _rss_mib()
        gc.collect()
        gc.freeze()
        gc.callbacks.append(timers.gc_callback)
        started = time.perf_counter()
        samples: list[float] = []  # RSS after each batch
        try:
            for i in range(0, max(map(len, parts.values())), per):
                batch = {p: recs[i : i + per] for p, recs in parts.items() if recs[i : i + per]}
                now = time.time()
                out = Output()
                with policy.batch():
                    t0 = time.perf_counter()
                    for p, recs in batch.items():
                        parse([r.value for r in recs])  # what the step then takes parsed
                        out.extend(intake.step(p, recs, now))
                    t = time.perf_counter()
                    timers.seconds["step"] += t - t0
                    store(out)
                    timers.seconds["store"] += time.perf_counter() - t
                    for p in batch:
                        intake.commit(p)
                policy.maybe_collect()
                samples.append(_rss_mib())
        finally:
            gc.callbacks.remove(timers.gc_callback)
        elapsed = time.perf_counter() - started
        engine_end, parts_end = _engine_mib(client), _active_parts(client)
        if trace:
            gc.unfreeze()
            gc.collect()
            end, peak = tracemalloc.get_traced_memory()
            traced += _traced_rows(tracemalloc.take_snapshot())
            del out, batch  # the last batch's records and output
            gc.collect()
            after_batch = tracemalloc.get_traced_memory()[0]
            del intake, store, parse  # the lanes' run state (``parse`` holds the intake)
            gc.collect()
            after_state = tracemalloc.get_traced_memory()[0]
            tracemalloc.stop()
            traced[:0] = [
                _row("traced_peak", peak / 2**20, "MiB"),
                _row("traced_end", end / 2**20, "MiB"),
                _row("traced_last_batch", (end - after_batch) / 2**20, "MiB"),
                _row("traced_state", (after_batch - after_state) / 2**20, "MiB"),
            ]
        sinks.close_client(client)  # and its inserts' handles: the folder goes next
    sec = timers.seconds
    sec["core"] = sec.pop("step") - sec["parse"]
    rows = [_row("stages_events", total, "events"), _row("stages_batch", batch_size, "events")]
    rows.append(_row("stages_core_compiled", int(core.COMPILED), "bool"))
    rows += [_row("stages_events_per_s", total / elapsed, "events/s")]
    for stage in ("parse", "core", "columns"):
        rows.append(_row(f"stage_{stage}", sec[stage] / total * 1e6, "us/event"))
    inserts = sorted(k for k in sec if k.startswith("insert."))
    for key in inserts:
        rows.append(_row(f"stage_{key}", sec[key] / total * 1e6, "us/event"))
    inserted = sec["store"] - sec["columns"]  # wall time: the tables go in at once
    rows.append(_row("stage_insert_total", inserted / total * 1e6, "us/event"))
    rows.append(_row("stage_gc", sec["gc"] / total * 1e6, "us/event"))
    rows.append(_row("stage_total", elapsed / total * 1e6, "us/event"))
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rows.append(_row("stages_peak_rss", peak_kib / 1024, "MiB"))
    rows.append(_row("stages_rss_start", rss_start, "MiB"))
    for q in (1, 2, 3, 4):
        rows.append(_row(f"stages_rss_{q}q", samples[max(0, len(samples) * q // 4 - 1)], "MiB"))
    rows.append(_row("stages_engine_start", engine_start, "MiB"))
    rows.append(_row("stages_engine_end", engine_end, "MiB"))
    rows.append(_row("stages_active_parts", parts_end, "parts"))
    return rows + traced


def core_only(events: int, batch_size: int = BATCH, repeat: int = 3) -> list[dict[str, Any]]:
    """The intake step alone (``Intake.step`` and ``commit``, no ledger), in this process:
    the least noisy figure for a change to the parser or the core. Each of ``repeat`` runs
    takes a fresh intake over the same fleet with the worker's collector policy, the
    partitions' batches in turn and the wall clock as processing time, as the worker steps
    them: the watermark moves, so runs close, rest and shrink as they do there. The rows
    are the best run's parse and rest of the step, in CPU time per event."""
    from prism.pipeline import core
    from prism.pipeline.core import Intake
    from prism.pipeline.settings import Settings
    from prism.pipeline.worker._gc import GcPolicy

    parts = _fleet(events)
    total = sum(map(len, parts.values()))
    settings = Settings()
    per = max(1, batch_size // PARTITIONS)
    best: tuple[float, float, int] | None = None  # (step, parse) CPU seconds, runs closed
    for _ in range(repeat):
        intake = Intake(settings.core_config(), max_event_bytes=settings.max_event_bytes)
        timers = _Timers(time.process_time)
        parse = timers.timed("parse", intake.parse_ahead)
        policy = GcPolicy()
        closed = 0
        gc.collect()
        gc.freeze()
        started = time.process_time()
        for i in range(0, max(map(len, parts.values())), per):
            for p, recs in parts.items():  # the partitions in turn, so the watermark moves
                batch = recs[i : i + per]
                if not batch:
                    continue
                with policy.batch():
                    parse([r.value for r in batch])
                    closed += intake.step(p, batch, time.time()).stats["closed"]
                    intake.commit(p)
        step = time.process_time() - started
        if best is None or step < best[0]:
            best = (step, timers.seconds["parse"], closed)
        del intake
        gc.unfreeze()
        gc.collect()
    assert best is not None
    rows = [_row("core_events", total, "events"), _row("core_repeat", repeat, "runs")]
    rows.append(_row("core_compiled", int(core.COMPILED), "bool"))
    rows.append(_row("core_closed", best[2], "runs"))
    rows.append(_row("core_step", best[0] / total * 1e6, "us/event"))
    rows.append(_row("core_parse", best[1] / total * 1e6, "us/event"))
    rows.append(_row("core_rest", (best[0] - best[1]) / total * 1e6, "us/event"))
    return rows


def main(argv: list[str]) -> None:
    from bench._cli import parser, positive_int, print_rows

    p = parser(
        "bench_stages",
        __doc__,
        [
            "                     # 100k events in batches of 20,000",
            "--batch 5000 --tracemalloc   # what holds the heap",
            "--core-only --repeat 3       # the intake step alone",
        ],
    )
    p.add_argument(
        "--events", type=positive_int, help="fleet size (default 100,000; core-only 60,000)"
    )
    p.add_argument(
        "--batch", type=positive_int, default=BATCH, help=f"events per batch (default {BATCH:,})"
    )
    p.add_argument("--tracemalloc", action="store_true", help="also say what holds the Python heap")
    p.add_argument(
        "--core-only", action="store_true", help="time the intake step alone, in CPU time"
    )
    p.add_argument(
        "--repeat", type=positive_int, default=3, help="core-only: best of this many runs"
    )
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # run()'s own process
    args = p.parse_args(argv)
    if args.core_only:
        rows = core_only(args.events or 60_000, args.batch, args.repeat)
    elif args.child:
        print(json.dumps(_child(args.quick, args.events, args.batch, args.tracemalloc)))
        return
    else:
        rows = run(args.quick, args.events, batch=args.batch, trace=args.tracemalloc)
    print_rows(rows)


if __name__ == "__main__":
    main(sys.argv[1:])
