"""Staleness is a function of the set of events, not of when a run arrived (rule 10)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from prism.pipeline.core import CoreConfig, InRecord, Intake, store_isolating
from tests.fixtures.events import event_bytes, make_event

T0 = datetime(2026, 11, 30, tzinfo=UTC)
NOW = (T0 + timedelta(hours=3)).timestamp()


def _record(run: str, at: datetime, lane: int, offset: int) -> InRecord:
    ts = at.isoformat().replace("+00:00", "Z")
    return InRecord(event_bytes(make_event("agent_started", run, 0, envelope={"ts": ts})), "t",
                    lane, offset)  # fmt: skip


def _statuses(intake: Intake, batches: dict[int, list[InRecord]], now: float) -> dict[str, str]:
    out = store_isolating(intake, batches, now, lambda _: None)
    return {row.run_id: row.status for row in out.ledger.runs}


def test_a_run_arriving_after_the_watermark_settled_is_judged_stale_at_once() -> None:
    # The worker's read-back: a lane's processor exists (restored, ticked) at the final
    # watermark before its records arrive; the watermark does not move when they do.
    intake = Intake(CoreConfig(stale_after_s=600, processing_grace=False))
    assert _statuses(intake, {0: [_record("late-clock", T0 + timedelta(hours=2), 0, 0)]}, NOW)
    intake.processor(1)
    intake.commit(intake.tick(NOW))  # lane 1 ticked empty: its scan saw this watermark
    seen = _statuses(intake, {1: [_record("old-run", T0, 1, 0)]}, NOW + 1)
    assert seen == {"old-run": "incomplete"}  # as a file with every event gives


def test_a_stale_run_that_comes_back_to_life_is_judged_again_at_the_same_watermark() -> None:
    intake = Intake(CoreConfig(stale_after_s=600, processing_grace=False))
    first = [_record("late-clock", T0 + timedelta(hours=2), 0, 0), _record("r", T0, 0, 1)]
    assert _statuses(intake, {0: first}, NOW)["r"] == "incomplete"
    # an older event of the same run: still silent for longer than the threshold
    again = make_event(
        "agent_started",
        "r",
        1,
        envelope={"ts": (T0 - timedelta(seconds=5)).isoformat().replace("+00:00", "Z")},
    )
    late = InRecord(event_bytes(again), "t", 0, 2)  # fmt: skip
    assert _statuses(intake, {0: [late]}, NOW + 1).get("r") == "incomplete"
