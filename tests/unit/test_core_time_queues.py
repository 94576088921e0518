"""A closed run shrinks to a tombstone, and is forgotten, when the watermark reaches its
time, whatever order runs closed in (rules 10 and 17).

Runs wait for their shrink and their retirement in time queues. A run closed by the
processing-time grace while the watermark was held back closes at its terminal's time,
which can be far ahead of a run that closes after it, so the queues are not filled in
time order. Read as first-in first-out, a run due later held back every run behind it:
a worker's lanes kept thousands of shrinkable runs whole, and a process that restored
the lane (where the queues are rebuilt in time order) shrank them all in its first tick,
which took 8-27 s in a soak with the lane's slot held still. The outcome must not depend
on whether the lane was restored in between.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from prism.pipeline.core import CoreConfig, InRecord, Intake, Output, store_isolating
from tests.fixtures.events import _T0, event_bytes, make_event

NOW = (_T0 + timedelta(hours=3)).timestamp()
_US = 1_000_000
REMOTE = 99  # another process's lane: it holds the watermark while it has records waiting


def _rec(run: str, type_: str, seq: int, offset: int, at_s: float) -> InRecord:
    event = make_event(type_, run, seq)
    event["ts"] = (_T0 + timedelta(seconds=at_s)).isoformat().replace("+00:00", "Z")
    return InRecord(event_bytes(event), "t", 0, offset)


def _keep(state: dict[str, bytes], outs: dict[int, Output]) -> None:
    for out in outs.values():
        for key, value in out.state_writes.items():
            if value is None:
                state.pop(key, None)
            else:
                state[key] = value


def _shrunk(intake: Intake) -> set[str]:
    return {r for r, run in intake.processor(0).thawed().items() if run.tombstone is not None}


def _t0_us(seconds: float) -> int:
    return int((_T0 + timedelta(seconds=seconds)).timestamp() * _US)


def _two_runs_closed_out_of_time_order() -> tuple[Intake, dict[str, bytes]]:
    """Run ``late`` (terminal at T0+101 s) closes first, run ``early`` (T0+1 s) after it,
    both by the processing-time grace while the remote lane holds the watermark at 0."""
    intake = Intake(CoreConfig(grace_period_s=2, processing_grace=True))
    intake.clock.remote(REMOTE, 0, False)
    state: dict[str, bytes] = {}
    late = [_rec("late", "agent_started", 0, 0, 100), _rec("late", "agent_finished", 1, 1, 101)]
    _keep(state, {0: store_isolating(intake, {0: late}, NOW, lambda _: None)})
    outs = intake.tick(NOW + 3)
    intake.commit(outs)
    _keep(state, outs)
    early = [_rec("early", "agent_started", 0, 2, 0), _rec("early", "agent_finished", 1, 3, 1)]
    _keep(state, {0: store_isolating(intake, {0: early}, NOW + 4, lambda _: None)})
    outs = intake.tick(NOW + 7)
    intake.commit(outs)
    _keep(state, outs)
    runs = intake.processor(0).thawed()
    assert runs["late"].closed and runs["early"].closed
    assert _shrunk(intake) == set()  # the watermark is at 0: nothing is due
    return intake, state


def _tick_at(intake: Intake, remote_s: float, now: float) -> dict[int, Output]:
    intake.clock.remote(REMOTE, _t0_us(remote_s), False)
    outs = intake.tick(now)
    intake.commit(outs)
    return outs


def test_a_run_shrinks_when_due_though_a_run_due_later_closed_before_it() -> None:
    intake, _ = _two_runs_closed_out_of_time_order()
    _tick_at(intake, 50, NOW + 8)  # the watermark: T0+50 s, past early's close + grace
    assert _shrunk(intake) == {"early"}  # not held back by late, due at T0+103 s
    _tick_at(intake, 200, NOW + 9)
    assert _shrunk(intake) == {"early", "late"}


def test_a_run_is_forgotten_when_due_though_a_run_due_later_closed_before_it() -> None:
    intake, _ = _two_runs_closed_out_of_time_order()
    retention = intake.config.tombstone_retention_s
    _tick_at(intake, 50 + retention, NOW + 8)  # past early's close + retention only
    assert set(intake.processor(0).thawed()) == {"late"}


def test_a_restored_lane_ticks_as_the_lane_it_was_restored_from() -> None:
    warm, state = _two_runs_closed_out_of_time_order()
    written: dict[str, Any] = {}
    _keep(written, _tick_at(warm, 50, NOW + 8))
    _keep(state, {0: Output(state_writes=dict(written))})

    restored = Intake(CoreConfig(grace_period_s=2, processing_grace=True))
    restored.load(0, list(state.items()))
    outs = _tick_at(restored, 50, NOW + 8)  # the same time again: nothing more is due
    runs_written = [k for o in outs.values() for k in o.state_writes if k.startswith("r")]
    assert runs_written == []
    assert _shrunk(restored) == _shrunk(warm) == {"early"}
