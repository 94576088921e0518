"""Ingest benchmark: ``prism-pipeline ingest-file`` over the pipeline benchmark's fleet.

The same fleet the worker drains (no chaos, seed 20261130) is written as a JSONL file and
replayed by ``prism-pipeline ingest-file`` in a child process into a fresh chDB path with
the defaults (the worker's batch size, collector policy and GIL switch interval, parse-ahead
as ``PRISM_PARSE_AHEAD`` says). Rows (``ingest_vs_worker``, its share of the worker's rate,
is derived beside the worker's in ``bench._summary``):

- ``ingest_events_per_s``: events over the command's wall time, start to exit, as a user
  times it (startup, migrations and the final close included);
- ``ingest_startup``: the wall time of the same command over an empty file (imports,
  ledger migrations, the close), what the rate above carries beside the events;
- ``ingest_peak_rss``: the child's peak RSS (``ru_maxrss`` from ``os.wait4``).

Part ``ingest`` of ``python -m bench`` (``bench.bench_pipeline``), after ``worker``.
Run alone: ``.venv/bin/python -m bench.bench_ingest [--quick] [--events N]``.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.bench_pipeline import Log, _row, _stderr  # the pipeline part's rows and log

__all__ = ["ingest_rows", "measure_ingest", "run"]


def ingest_rows(
    events: int, seconds: float, peak_rss_kib: int, startup: float | None = None
) -> list[dict[str, Any]]:
    """The rows of one ``ingest-file`` run: ``events`` in ``seconds`` of wall time."""
    if events <= 0 or seconds <= 0:
        raise ValueError(f"no ingest rate from {events} events in {seconds} s")
    rows = [
        _row("ingest_events_per_s", events / seconds, "events/s"),
        _row("ingest_seconds", seconds, "s"),
    ]
    if startup is not None:
        rows.append(_row("ingest_startup", startup, "s"))
    rows.append(_row("ingest_peak_rss", peak_rss_kib / 1024, "MiB"))
    return rows


def _ingest_file(path: Path, ledger: Path, log_path: Path) -> tuple[float, int]:
    """``prism-pipeline ingest-file path`` in a child; (wall seconds, peak RSS in KiB)."""
    ledger.parent.mkdir(parents=True, exist_ok=True)  # a chDB path's parent must exist
    cmd = [sys.executable, "-m", "prism.pipeline.cli", "ingest-file", str(path),
           "--clickhouse", f"chdb://{ledger}", "--no-progress"]  # fmt: skip
    with open(log_path, "wb") as out:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - started
    proc.returncode = code = os.waitstatus_to_exitcode(status)
    if code != 0:
        tail = log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"ingest-file exited with {code}; log {log_path}:\n{tail}")
    return seconds, usage.ru_maxrss


def measure_ingest(
    values: Sequence[bytes], root: Path, logs: Path, log: Log = _stderr
) -> list[dict[str, Any]]:
    """Write ``values`` as JSONL under ``root`` and time ``ingest-file`` over them."""
    folder = root / "ingest"
    folder.mkdir(parents=True, exist_ok=True)
    fleet, empty = folder / "fleet.jsonl", folder / "empty.jsonl"
    with open(fleet, "wb") as f:
        for value in values:
            f.write(value + b"\n")
    empty.write_bytes(b"")
    startup, _ = _ingest_file(empty, folder / "empty" / "ledger", logs / "ingest-empty.log")
    seconds, rss = _ingest_file(fleet, folder / "fleet" / "ledger", logs / "ingest-file.log")
    log(
        f"ingest: {len(values):,} events in {seconds:.1f}s ({len(values) / seconds:,.0f}/s, "
        f"startup {startup:.1f}s), peak RSS {rss / 1024:.0f} MiB"
    )
    return ingest_rows(len(values), seconds, rss, startup)


def run(quick: bool = False, events: int | None = None) -> list[dict[str, Any]]:
    """The pipeline benchmark's fleet (without a broker) through ``ingest-file``."""
    from bench.bench_pipeline import EVENTS_FULL, EVENTS_PER_RUN, EVENTS_QUICK, SEED
    from prism.runtime.simulator import FleetConfig, simulate

    target = events or (EVENTS_QUICK if quick else EVENTS_FULL)
    fleet = simulate(FleetConfig(runs=max(1, math.ceil(target / EVENTS_PER_RUN)), seed=SEED))
    values = [r.value for r in fleet.records]
    del fleet
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        return measure_ingest(values, Path(tmp), Path(tmp))


if __name__ == "__main__":
    from bench._cli import parser, positive_int, print_rows

    cli = parser("bench_ingest", __doc__, ["", "--quick", "--events 500000"])
    cli.add_argument("--events", type=positive_int, help="fleet size (default: the pipeline's)")
    args = cli.parse_args()
    print_rows(run(quick=args.quick, events=args.events))
