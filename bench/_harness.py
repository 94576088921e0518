"""``python -m bench``: run the benchmarks, print one table with the targets, write the JSON.

Order: the pipeline parts (``baseline``, ``worker``, ``machinery``, ``ingest``,
``freshness``; one broker, one fleet), then ``stages`` (the worker's store step per
stage, in-process), ``publisher`` (its own broker), ``parse``, ``ledger`` and
``scaleout`` (its own broker; 1, 2 and 3 worker processes in one group). A benchmark
that fails is reported and the rest still run; the exit code is then 1. Targets are reported, never
asserted: the table (``bench._summary``) shows each beside its figure with "met", "not met"
or "not measured"; ``--rows`` prints every row measured as well.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench._cli import positive_int
from bench._summary import (
    TARGETS,
    Target,
    derived_rows,
    evaluate_targets,
    format_value,
    render_summary,
    summary_rows,
)
from bench.bench_pipeline import DEFAULT_RATES

__all__ = [
    "MODULE_BENCHES",
    "NAMES",
    "TARGETS",
    "Target",
    "evaluate_targets",
    "format_value",
    "main",
    "parse_args",
    "render_table",
    "results_document",
]

PIPELINE_PARTS = ("baseline", "worker", "machinery", "ingest", "freshness")
MODULE_BENCHES = ("stages", "publisher", "parse", "ledger", "scaleout")
NAMES = (*PIPELINE_PARTS, *MODULE_BENCHES)
ALIASES = {"pipeline": PIPELINE_PARTS, "all": NAMES}
RESULTS_DIR = Path(__file__).resolve().parent.parent / ".bench"

Row = dict[str, Any]


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line; ``only`` comes back as the expanded, ordered list of names.

    Example::

        parse_args(["--quick", "--only", "pipeline", "parse"]).only
        # ['baseline', 'worker', 'freshness', 'parse']
    """
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description="Run the benchmarks side by side; print a table and the targets, write JSON.",
    )
    p.add_argument("--quick", action="store_true", help="smaller sizes (about 90 s in all)")
    p.add_argument(
        "--only",
        nargs="+",
        action="extend",
        metavar="NAME",
        choices=[*NAMES, *ALIASES],
        help=f"run only these: {', '.join(NAMES)} (or 'pipeline' for the first five)",
    )
    p.add_argument(
        "--events",
        type=positive_int,
        metavar="N",
        help="fleet size for baseline/worker/machinery/ingest (default 200000; quick 30000)",
    )
    p.add_argument(
        "--rate",
        type=_positive_float,
        nargs="+",
        action="extend",
        metavar="R",
        help="events/s offered in the freshness part, each rate on a fresh topic and worker "
        "(default: 5000 and 10000; the targets name these two)",
    )
    p.add_argument(
        "--rows",
        action="store_true",
        help="also print every row measured (the JSON always has them)",
    )
    p.add_argument(
        "--json",
        type=Path,
        metavar="PATH",
        help="where to write the results (default .bench/results-<timestamp>.json)",
    )
    args = p.parse_args(argv)
    args.rate = list(args.rate or DEFAULT_RATES)
    chosen: set[str] = set()
    for name in args.only or NAMES:
        chosen.update(ALIASES.get(name, (name,)))
    args.only = [n for n in NAMES if n in chosen]
    return args


def render_table(rows: Sequence[Row]) -> str:
    """One aligned text table: bench, metric, value, unit."""
    header = ("bench", "metric", "value", "unit")
    cells = [
        (str(r["bench"]), str(r["metric"]), format_value(r["value"]), str(r["unit"])) for r in rows
    ]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(header)]

    def line(c: Sequence[str]) -> str:
        return f"{c[0]:<{widths[0]}}  {c[1]:<{widths[1]}}  {c[2]:>{widths[2]}}  {c[3]}".rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), rule, *(line(c) for c in cells)])


def results_document(
    rows: Sequence[Row],
    targets: Sequence[dict[str, Any]],
    errors: Sequence[str],
    args: argparse.Namespace,
    started: datetime,
    seconds: float,
    load_start: Sequence[float],
) -> dict[str, Any]:
    """The JSON written at the end: options, machine, rows, the printed table's lines
    (``summary``), targets, errors."""
    return {
        "started_at": started.isoformat(timespec="seconds"),
        "seconds": round(seconds, 1),
        "options": {
            "quick": args.quick,
            "only": args.only,
            "events": args.events,
            "rate": args.rate,
        },
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "loadavg_start": list(load_start),
            "loadavg_end": list(os.getloadavg()),
        },
        "rows": list(rows),
        "summary": summary_rows(
            rows, {"pipeline" if n in PIPELINE_PARTS else n for n in args.only}
        ),
        "targets": list(targets),
        "errors": list(errors),
    }


_T0 = time.monotonic()


def _log(msg: str) -> None:
    print(f"[bench {time.monotonic() - _T0:5.0f}s] {msg}", file=sys.stderr, flush=True)


def _machine_line(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    load = "/".join(f"{x:.1f}" for x in (m["loadavg_start"][0], m["loadavg_end"][0]))
    return f"{doc['started_at']}, {m['cpus']} CPUs, load average {load} (start/end)"


def _module_runner(name: str) -> Callable[[bool], list[Row]]:
    module = importlib.import_module(f"bench.bench_{name}")
    runner: Callable[[bool], list[Row]] = module.run
    return runner


def main(argv: Sequence[str] | None = None) -> int:
    """Run, print, write; 0 when every chosen benchmark ran, 1 when one failed."""
    args = parse_args(argv)
    started, t0, load_start = datetime.now(UTC), time.monotonic(), os.getloadavg()
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    out_path: Path = args.json or RESULTS_DIR / f"results-{stamp}.json"
    rows: list[Row] = []
    errors: list[str] = []
    parts = [n for n in args.only if n in PIPELINE_PARTS]
    if parts:
        from bench.bench_pipeline import measure

        _log(f"pipeline: {', '.join(parts)}")
        try:
            got, errs = measure(
                args.quick,
                events=args.events,
                rates=args.rate,
                parts=parts,
                log_dir=RESULTS_DIR / f"logs-{stamp}",
                log=_log,
            )
            rows += got
            errors += errs
        except Exception as exc:
            errors.append(f"pipeline: {type(exc).__name__}: {exc}")
            _log(errors[-1])
    for name in (n for n in args.only if n in MODULE_BENCHES):
        _log(f"{name}: running")
        t1 = time.monotonic()
        try:
            rows += _module_runner(name)(args.quick)
            _log(f"{name}: done in {time.monotonic() - t1:.0f}s")
        except Exception as exc:  # one broken benchmark must not hide the others
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
            _log(errors[-1])
    rows += derived_rows(rows)
    targets = evaluate_targets(rows)
    doc = results_document(rows, targets, errors, args, started, time.monotonic() - t0, load_start)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(doc, indent=1) + "\n")
    if args.rows:
        print(render_table(rows))
        print()
    print(f"{_machine_line(doc)}; targets are reported, not asserted")
    print(render_summary(doc["summary"]))
    for err in errors:
        print(f"error: {err.splitlines()[0]}")
    print(f"\n{len(rows)} rows in {doc['seconds']:.0f}s; results: {out_path}")
    return 1 if errors else 0
