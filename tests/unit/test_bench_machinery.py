"""``bench._machinery``: the worker's batch step with its core taken out (no broker here)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest

from bench._machinery import NullStep, raw_row_of
from prism.pipeline.core import InRecord, Output
from prism.runtime.simulator import FleetConfig, simulate

REPO = Path(__file__).resolve().parents[2]
RECEIVED = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


class _Telemetry:
    def __init__(self) -> None:
        self.stages: dict[str, float] = {}

    def stage(self, name: str, seconds: float) -> None:
        self.stages[name] = self.stages.get(name, 0.0) + seconds


def _records(n: int, partition: int, first_offset: int, source: str = "t.in") -> list[InRecord]:
    values = [r.value for r in simulate(FleetConfig(runs=4, seed=7)).records][:n]
    assert len(values) == n
    return [
        InRecord(v, source, partition, first_offset + i, traceparent=None)
        for i, v in enumerate(values)
    ]


def test_a_record_becomes_the_bare_loops_row_with_the_value_as_its_payload() -> None:
    rec = _records(1, 2, 40)[0]
    event = orjson.loads(rec.value or b"")
    row = raw_row_of(rec, RECEIVED)
    assert (row.event_id, row.run_id, row.seq, row.type) == (
        event["eventId"], event["runId"], event["seq"], event["type"],
    )  # fmt: skip
    assert row.ts == datetime.fromisoformat(event["ts"]) and row.ts.tzinfo is not None
    assert row.payload == (rec.value or b"").decode()
    assert (row.source, row.partition, row.offset, row.received_at) == ("t.in", 2, 40, RECEIVED)


@pytest.mark.parametrize("value", [b"{not json", b'{"eventId": "e1"}', None, b"[1, 2]"])
def test_a_value_that_is_not_an_event_is_refused_by_its_position(value: bytes | None) -> None:
    with pytest.raises(ValueError, match=r"t\.in\[3\]@17 is not an agent event"):
        raw_row_of(InRecord(value, "t.in", 3, 17), RECEIVED)


def test_the_null_step_stores_each_lanes_rows_and_hands_their_offsets_to_its_slot() -> None:
    stored: list[Output] = []
    telemetry = _Telemetry()
    step = NullStep(None, stored.append, telemetry, 1 << 20, lambda: RECEIVED.timestamp())  # type: ignore[arg-type]
    lane0 = _records(5, 0, 100)
    lane1 = _records(3, 1, 7) + _records(2, 1, 20, source="t.fwd")
    parts: dict[int, Output] = {0: Output()}
    out = step.step({0: lane0, 1: lane1}, parts, forwarded=False)

    # one store per lane, before the step returns: the rows are acknowledged first
    assert [len(o.ledger.events) for o in stored] == [5, 5]
    assert [r.offset for r in out.ledger.events] == [100, 101, 102, 103, 104, 7, 8, 9, 20, 21]
    # each (source, partition)'s span of offsets names the rows' deduplication token
    assert stored[0].ranges == [("t.in", 0, 100, 104)]
    assert stored[1].ranges == [("t.fwd", 1, 20, 21), ("t.in", 1, 7, 9)]
    assert [len(parts[lane].ledger.events) for lane in (0, 1)] == [5, 5]
    assert {r.received_at for r in out.ledger.events} == {RECEIVED}
    assert not out.state_writes and not out.closed  # no run semantics at all
    assert set(telemetry.stages) == {"step_thread", "step_thread_cpu", "store"}


def test_a_failing_store_still_times_the_step_and_leaves_the_slot_untouched() -> None:
    telemetry = _Telemetry()

    def refuse(out: Output) -> None:
        raise ConnectionError("the ledger is away")

    step = NullStep(None, refuse, telemetry, 1 << 20, lambda: 0.0)  # type: ignore[arg-type]
    parts: dict[int, Output] = {}
    with pytest.raises(ConnectionError):
        step.step({0: _records(2, 0, 0)}, parts, forwarded=False)
    assert parts == {} and "step_thread" in telemetry.stages


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("wrap", "expected"), [("", "StepThread"), ("null", "NullStep")])
def test_the_worker_takes_its_step_from_the_hook_only_when_given_one(
    tmp_path: Path, wrap: str, expected: str
) -> None:
    code = textwrap.dedent(
        """
        import sys
        from bench._machinery import NullStep
        from prism.pipeline.settings import load_settings
        from prism.pipeline.worker import WorkerHooks, build_worker

        hooks = WorkerHooks(wrap_step=NullStep.of) if sys.argv[1] else None
        worker = build_worker(load_settings(), hooks)
        step = worker.step_thread
        print(type(step).__name__, step.store is worker.store, step.intake is worker.intake)
        """
    )
    env = {
        **os.environ,
        "PRISM_CLICKHOUSE_DSN": f"chdb://{tmp_path / 'ledger'}",
        "PRISM_STATE_DIR": str(tmp_path / "state"),
    }
    out = subprocess.run(
        [sys.executable, "-c", code, wrap],
        capture_output=True, text=True, timeout=100, check=False, env=env, cwd=REPO,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[-2] == f"{expected} True True"


def test_the_machinery_process_runs_the_benchmark_module_with_the_workers_options() -> None:
    from bench._machinery import MachineryProcess

    proc = MachineryProcess({"PRISM_METRICS_PORT": "0"}, args=("--group", "g1"))
    assert proc.command() == [sys.executable, "-m", "bench._machinery", "--group", "g1"]
