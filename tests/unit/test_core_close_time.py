"""When a run closed, in event time: never earlier than its terminal (rules 2, 10, 17).

A run closed by the processing-time grace (the live worker) may close while the
pipeline-wide watermark is held far back, even at 0: a lane another process holds that
has records waiting and has seen no event yet holds it there. The time the run closed
at decides when its facts shrink to a tombstone and when it is forgotten, so it must not
be that watermark: a run "closed at 0" was forgotten at the next scan (0 is more than a
day before any real watermark), and the gap-filling event that came next started a new,
one-event run beside the closed one, which went stale. Seen in the chaos soak; the
run's close is now at its terminal's time at least.
"""

from __future__ import annotations

from datetime import timedelta

from prism.pipeline.core import CoreConfig, InRecord, Intake, store_isolating
from tests.fixtures.events import _T0, event_bytes, make_event

NOW = (_T0 + timedelta(hours=3)).timestamp()


def _rec(type_: str, seq: int, offset: int, **data: object) -> InRecord:
    return InRecord(event_bytes(make_event(type_, "r", seq, **data)), "t", 0, offset)


def _step(intake: Intake, records: list[InRecord], now: float) -> dict[str, tuple[bool, int, int]]:
    """The run rows a step wrote: (closed, missing seqs, events)."""
    out = store_isolating(intake, {0: records}, now, lambda _: None)
    return {row.run_id: (row.closed, row.missing_count, row.event_count) for row in out.ledger.runs}


def test_a_run_closed_while_a_remote_lane_holds_the_watermark_at_zero_is_not_forgotten() -> None:
    intake = Intake(CoreConfig(grace_period_s=2, processing_grace=True))
    intake.clock.remote(99, 0, False)  # another process's lane: records waiting, no mark yet
    assert intake.clock.watermark_us == 0
    first = [_rec("agent_started", 0, 0), _rec("agent_finished", 2, 1)]  # seq 1 missing
    assert _step(intake, first, NOW) == {"r": (False, 1, 2)}  # waits for seq 1
    closed = intake.tick(NOW + 3)  # the grace ends in processing time: closed with its gap
    intake.commit(closed)
    rows = [row for out in closed.values() for row in out.ledger.runs]
    assert [(r.closed, r.missing_count) for r in rows] == [(True, 1)]
    intake.clock.forget_remote(99)  # the remote lane's report expired: the watermark moves
    intake.commit(intake.tick(NOW + 4))  # a scan at the real watermark
    assert "r" in intake.processor(0).thawed()  # a closed run with a gap waits for it
    seen = _step(intake, [_rec("provider_turn_finished", 1, 2)], NOW + 5)
    assert seen["r"] == (True, 0, 3)  # the gap filled on the closed run
