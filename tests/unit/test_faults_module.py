"""Fault specs: parsed strictly, inert when empty, each fault firing exactly where it says."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from prism.devstack import faults as _faults
from prism.devstack.faults import STALL_SECONDS, FaultPlan, FaultSpecError, parse_faults
from prism.sinks import FlushResult, SourceRange
from prism.sinks._errors import is_transient  # the writer's own retry predicate


class Killed(Exception):
    """Stands in for SIGKILL: stops the flush where the process would have died."""


class FakeWriter:
    """Inserts each flush's tables through the hook, like ``LedgerWriter.flush``."""

    def __init__(self, hook: Callable[[str, Callable[[], object]], object]) -> None:
        self.hook = hook
        self.stored: list[tuple[int, str]] = []
        self.flushes = 0
        self.tables: tuple[str, ...] = ("run_events_store", "runs_store")  # of the next flush

    def flush(self) -> FlushResult:
        self.flushes += 1
        n = self.flushes
        for table in self.tables:
            self.hook(table, functools.partial(self.stored.append, (n, table)))
        rows = {t: 1 for t in self.tables}
        return FlushResult(rows, 0.0, 1, (SourceRange("prism.agent-events", 0, n, n),))


def _rig(spec: str, clock: Callable[[], float] | None = None) -> tuple[Any, FakeWriter, list[Any]]:
    plan = parse_faults(spec)
    assert plan is not None
    kills: list[list[tuple[int, str]]] = []
    inner = FakeWriter(plan.insert_hook)

    def kill() -> None:
        kills.append(list(inner.stored))
        raise Killed

    plan.kill = kill
    if clock is not None:
        plan.clock = clock
    return plan.wrap(inner), inner, kills


@pytest.mark.parametrize("spec", ["", " , "])
def test_an_empty_spec_means_no_faults(spec: str) -> None:
    assert parse_faults(spec) is None


def test_a_spec_combines_kinds() -> None:
    plan = parse_faults("kill_mid_insert:4, fail_inserts:2.5s@3")
    assert plan is not None
    assert (plan.kill_mid_insert, plan.fail_seconds, plan.fail_from_flush) == (4, 2.5, 3)
    assert (plan.kill_after_insert, plan.fail_calls) == (None, None)


@pytest.mark.parametrize(
    "spec",
    [
        "kill_after_insert",
        "kill_after_insert:0",
        "kill_after_insert:3s",
        "kill_mid_insert:2@1",
        "fail_inserts:1.5",
        "fail_inserts:0s",
        "fail_inserts:3@0",
        "explode:1",
        "fail_inserts:3,fail_inserts:4",
        "drop_fetch:0",
        "drop_fetch:2s",
        "drop_fetch:1@2",
        "stall_after_insert:0",
        "stall_after_insert:3s",
    ],
)
def test_a_bad_spec_is_refused_with_the_item_named(spec: str) -> None:
    with pytest.raises(FaultSpecError, match="fault spec"):
        parse_faults(spec)


def test_drop_fetch_drops_exactly_the_chunk_it_names_and_says_so(
    capfd: pytest.CaptureFixture[str],
) -> None:
    plan = parse_faults("drop_fetch:2")
    assert plan is not None and plan.drop_fetch == 2
    recs = [SimpleNamespace(offset=o) for o in (7, 8, 9)]
    assert [plan.fetch_hook("t.agent-events", 1, recs) for _ in range(4)] == [
        False, True, False, False,
    ]  # fmt: skip
    assert capfd.readouterr().err == (
        "prism-fault: drop_fetch: chunk 2 (t.agent-events[1] offsets 7..9) dropped\n"
    )


def test_kill_after_insert_fires_once_every_table_of_the_flush_is_stored() -> None:
    writer, inner, kills = _rig("kill_after_insert:2")
    writer.flush()
    assert kills == []
    inner.tables = ("run_events_store", "usage_store", "runs_store")
    with pytest.raises(Killed):
        writer.flush()
    assert kills == [
        [
            (1, "run_events_store"),
            (1, "runs_store"),
            (2, "run_events_store"),
            (2, "usage_store"),
            (2, "runs_store"),
        ]
    ]


def test_stall_after_insert_holds_the_first_flush_that_stored_rows_once(
    capfd: pytest.CaptureFixture[str],
) -> None:
    writer, inner, kills = _rig("stall_after_insert:2")
    slept: list[float] = []
    writer._plan.sleep = slept.append
    writer.flush()
    inner.tables = ()
    writer.flush()  # flush 2 stored nothing: no stall yet
    assert slept == []
    inner.tables = ("runs_store",)
    writer.flush()
    writer.flush()
    assert slept == [STALL_SECONDS] and kills == []
    assert inner.stored[-2:] == [(3, "runs_store"), (4, "runs_store")]  # inserted first
    assert capfd.readouterr().err.startswith("prism-fault: stall_after_insert: flush 3 stored")


def test_kill_after_insert_waits_for_a_flush_that_stored_rows() -> None:
    writer, inner, kills = _rig("kill_after_insert:1")
    inner.tables = ()
    writer.flush()
    assert kills == []
    inner.tables = ("runs_store",)
    with pytest.raises(Killed):
        writer.flush()
    assert len(kills) == 1


def test_kill_mid_insert_fires_between_the_first_and_second_table() -> None:
    writer, inner, kills = _rig("kill_mid_insert:2")
    writer.flush()
    inner.tables = ("runs_store",)  # flush 2 has one table: nothing to be in the middle of
    writer.flush()
    assert kills == []
    inner.tables = ("run_events_store", "usage_store", "runs_store")
    with pytest.raises(Killed):
        writer.flush()
    assert kills[0][-1] == (3, "run_events_store")
    assert (3, "usage_store") not in kills[0]


def test_kill_mid_insert_fires_as_the_first_table_returns_while_another_is_in_flight() -> None:
    """Parallel inserts: every table's insert begins before any is stored, so the kill
    comes when the first one returns with another still in flight."""
    _, inner, kills = _rig("kill_mid_insert:1")
    plan = inner.hook.__self__  # type: ignore[attr-defined]
    plan.flush_started()

    def usage_in_flight() -> None:  # runs_store's insert begins and ends meanwhile
        plan.insert_hook("runs_store", functools.partial(inner.stored.append, (1, "runs_store")))

    with pytest.raises(Killed):
        plan.insert_hook("usage_store", usage_in_flight)
    assert kills == [[(1, "runs_store")]]


def test_fail_inserts_by_count_fails_transiently_and_stores_nothing() -> None:
    writer, inner, _ = _rig("fail_inserts:3")
    errors = []
    for _ in range(3):
        with pytest.raises(ConnectionError) as err:
            writer.flush()
        errors.append(err.value)
    assert inner.stored == [] and all(is_transient(e) for e in errors)
    writer.flush()
    assert [t for _, t in inner.stored] == ["run_events_store", "runs_store"]


def test_fail_inserts_by_time_counts_from_the_first_failure_and_may_start_late() -> None:
    now = [100.0]
    writer, inner, _ = _rig("fail_inserts:10s@2", clock=lambda: now[0])
    writer.flush()  # flush 1 comes before the failures start
    for step in (0.0, 5.0, 4.9):
        now[0] += step
        with pytest.raises(ConnectionError):
            writer.flush()
    now[0] += 0.1
    writer.flush()
    assert [n for n, _ in inner.stored] == [1, 1, 5, 5]


def test_the_wrapper_passes_other_attributes_through() -> None:
    plan = FaultPlan()
    inner = FakeWriter(plan.insert_hook)
    inner.pending_rows = 7  # type: ignore[attr-defined]
    assert plan.wrap(inner).pending_rows == 7


def test_a_kill_is_a_real_sigkill_with_its_line_on_stderr() -> None:
    code = textwrap.dedent(
        """
        from prism.devstack import faults as _faults
        from prism.sinks import FlushResult

        class W:
            def flush(self):
                return FlushResult({"runs_store": 3}, 0.0, 1, ())

        _faults.parse_faults("kill_after_insert:1").wrap(W()).flush()
        print("survived")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=Path(_faults.__file__).parent.parent,
        env={"PATH": ""},
    )
    assert out.returncode == -signal.SIGKILL
    assert "prism-fault: kill_after_insert: flush 1 stored {'runs_store': 3}" in out.stderr
    assert "survived" not in out.stdout


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("faults", "wiring"),
    [("", "LedgerWriter None"), ("fail_inserts:1", "FaultyWriter insert_hook")],
)
def test_the_worker_installs_faults_only_through_its_hooks(
    tmp_path: Path, faults: str, wiring: str
) -> None:
    code = textwrap.dedent(
        """
        import sys
        from prism.devstack.faults import parse_faults
        from prism.pipeline.settings import load_settings
        from prism.pipeline.worker import WorkerHooks, build_worker

        plan = parse_faults(sys.argv[1])
        hooks = WorkerHooks(insert_hook=plan.insert_hook, wrap_writer=plan.wrap) if plan else None
        writer = build_worker(load_settings(), hooks).store.writer
        hook = getattr(writer, "_writer", writer)._hook
        print(type(writer).__name__, getattr(hook, "__name__", None))
        """
    )
    env = {
        **os.environ,
        "PRISM_STATE_STORE": "memory",
        "PRISM_CLICKHOUSE_DSN": f"chdb://{tmp_path / 'ledger'}",
        "PRISM_STATE_DIR": str(tmp_path / "state"),
    }
    out = subprocess.run(
        [sys.executable, "-c", code, faults],
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
        env=env,
        cwd=Path(_faults.__file__).parent.parent,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[-2] == wiring
