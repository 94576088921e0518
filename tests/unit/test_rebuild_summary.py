"""``rebuild``'s summary counts what the ledger holds, whatever the batches (rule 10)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from prism.pipeline.ingest import IngestSummary, ingest_lines
from prism.pipeline.replay._rebuild import RebuildSummary, _Replay
from prism.pipeline.settings import Settings
from prism.runtime.simulator import FleetConfig, simulate
from tests.fixtures.runs import NOW, RunBuilder

CHAOS = FleetConfig(runs=40, seed=31, duplicates=0.05, reorder_window=4, post_terminal=0.3,
                    conflicting_terminals=0.3, stale_after_seconds=60)  # fmt: skip


class _Writer:
    def add(self, batch: Any, *sources: Any) -> None: ...
    def flush(self) -> None: ...
    def discard(self) -> int:
        return 0


def _rebuilt(values: list[bytes], batch: int, clock: float) -> RebuildSummary:
    settings = Settings(stale_run_seconds=60, grace_period_seconds=30.0)
    replay = _Replay(settings, _Writer(), settings.topics.input, lambda: clock)
    replay.expect_lanes([0])
    records = [
        SimpleNamespace(value=v, topic=settings.topics.input, partition=0, offset=i, key=None,
                        headers=[])
        for i, v in enumerate(values)
    ]  # fmt: skip
    for i in range(0, len(records), batch):
        part = records[i : i + batch]
        replay.partition_batch(0, part, behind=i + batch < len(records))
    replay.finish()
    summary = RebuildSummary("db", "topic")
    summary.stats, summary.dead_letters = replay.stats, replay.dead_letters
    replay.tally.fill(summary)
    return summary


def test_the_rebuild_summary_is_the_same_for_every_batch_size_and_equals_a_file_replay() -> None:
    fleet = simulate(CHAOS)
    clock = fleet.manifest["params"]["processing_clock"]
    from datetime import datetime

    now = datetime.fromisoformat(clock.replace("Z", "+00:00")).timestamp()
    values = [r.value for r in fleet.records]
    one, whole = _rebuilt(values, 1, now), _rebuilt(values, 10_000, now)
    assert one.runs_by_status == whole.runs_by_status
    assert one.stats["applied"] == whole.stats["applied"]
    filed: IngestSummary = ingest_lines(values, source="f", store=None, clock=lambda: now)
    assert whole.stats["applied"] == filed.stats["applied"]


def test_an_event_applied_then_retracted_is_not_counted_by_a_rebuild() -> None:
    """A turn past the terminal, read before it: one record at a time it is applied, then
    retracted when the terminal arrives; the ledger holds three events, one run."""
    import orjson

    run = RunBuilder("r1").started().turn(1).finished().turn(2)
    values = [orjson.dumps(run.events[i]) for i in (0, 1, 3, 2)]
    for size in (1, 4):
        summary = _rebuilt(values, size, NOW)
        assert (summary.stats["applied"], summary.runs_by_status) == (3, {"succeeded": 1}), size
