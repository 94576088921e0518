"""The worker's machinery alone: ``prism-pipeline worker`` with its core taken out.

The same worker process (group protocol, slots, transactions, ledger writer, telemetry)
with its batch step swapped (``WorkerHooks.wrap_step``) for ``NullStep``, which does per
record what the bare loop (``bench._baseline``) does: ``orjson.loads`` and one raw-event
row (the value itself as its payload). The rows are stored as the worker stores them
(tokens from the records' offsets, acknowledged before the transactions), and each
slot's transaction still commits its offsets. No run semantics: no dedup, no state, no
timelines, no closed runs, no alerts. Its ledger is not a bill; it exists to split the
worker's distance from the bare loop into the core's part (worker against this) and the
machinery's (this against the bare loop): ``bench_pipeline``'s ``machinery`` part.

Run: ``python -m bench._machinery [worker options]`` (the worker's own options and
environment), as ``bench_pipeline`` does.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime

import orjson

from prism.devstack.workerproc import WorkerProcess
from prism.pipeline.core import InRecord, Output
from prism.pipeline.worker._step import StepThread, _timed
from prism.schemas import RawEventRow

__all__ = ["MachineryProcess", "NullStep", "main", "raw_row_of"]


def raw_row_of(rec: InRecord, received_at: datetime) -> RawEventRow:
    """The bare loop's row of ``rec``: its ids, seq, type, time and tenant, and the value
    as the payload. A value that is not such an event raises ``ValueError`` naming it."""
    try:
        d = orjson.loads(rec.value or b"")
        return RawEventRow(
            d["eventId"], d["runId"], d["seq"], d["type"], datetime.fromisoformat(d["ts"]),
            d.get("tenantId"), None, None, None, None, None, None, None, None,
            (rec.value or b"").decode(), rec.traceparent, rec.source, rec.partition,
            rec.offset, received_at,
        )  # fmt: skip
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(
            f"{rec.source}[{rec.partition}]@{rec.offset} is not an agent event the "
            f"machinery benchmark can store ({type(exc).__name__}: {exc})"
        ) from exc


class NullStep(StepThread):
    """``StepThread`` without the core: raw rows only, stored lane by lane as the worker
    stores them; the ``step_thread`` and ``store`` stages timed as the worker times them."""

    @classmethod
    def of(cls, step: StepThread) -> NullStep:
        return cls(step.intake, step.store, step.telemetry, step.max_state_bytes, step.clock)

    def step(
        self, batches: dict[int, list[InRecord]], parts: dict[int, Output], forwarded: bool
    ) -> Output:
        received = datetime.fromtimestamp(self.clock(), UTC)
        total = Output()
        with _timed(self.telemetry, "step_thread"):  # and step_thread_cpu, as the worker's
            for lane, records in batches.items():
                out = Output()
                out.ledger.events.extend(raw_row_of(r, received) for r in records)
                spans: dict[tuple[str, int], tuple[int, int]] = {}
                for r in records:
                    lo, hi = spans.get((r.source, r.partition), (r.offset, r.offset))
                    spans[(r.source, r.partition)] = (min(lo, r.offset), max(hi, r.offset))
                out.ranges.extend((s, p, lo, hi) for (s, p), (lo, hi) in sorted(spans.items()))
                stored = time.perf_counter()
                self.store(out)
                self.telemetry.stage("store", time.perf_counter() - stored)
                parts.setdefault(lane, Output()).extend(out)
                total.extend(out)
        return total


class MachineryProcess(WorkerProcess):
    """``WorkerProcess`` running ``python -m bench._machinery`` (its log, env and stop)."""

    def command(self) -> list[str]:
        return [sys.executable, "-m", "bench._machinery", *self.args]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench._machinery [worker options]``: the worker with ``NullStep``."""
    from prism.pipeline.commands.worker import overrides, register
    from prism.pipeline.settings import load_settings
    from prism.pipeline.worker import WorkerHooks, run_worker

    parser = argparse.ArgumentParser(prog="python -m bench._machinery")
    parser.add_argument("-v", "--verbose", action="store_true")
    register(parser.add_subparsers())
    options = parser.parse_args(["worker", *(sys.argv[1:] if argv is None else argv)])
    logging.getLogger("prism.worker").warning(
        "benchmark only: the worker's core is replaced by the bare loop's parse (no run "
        "semantics; this ledger is not a bill)"
    )
    level = logging.DEBUG if options.verbose else logging.INFO
    hooks = WorkerHooks(wrap_step=NullStep.of)
    return run_worker(load_settings(**overrides(options)), loglevel=level, hooks=hooks)


if __name__ == "__main__":
    raise SystemExit(main())
