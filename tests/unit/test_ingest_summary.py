"""The ``ingest-file`` summary is a function of the set of lines (schemas/CONTRACT.md rule 10).

Over chaotic simulated fleets (duplicates, reordering, post-terminal and conflicting
terminals, hostile producers, channel operations) and a stale threshold short enough
that runs go ``incomplete`` between their events, every count of the summary equals what
the ledger holds at the end (runs by status, events, quarantine by reason, alerts,
channel denials and stuck operations), and the summary is the same for every batch size
(but its alerts: see ``_without_alerts``). A summary that took the last run row it saw,
or added up each batch's counts, depended on where the batches were cut: an event
applied one line at a time and then retracted by a lower-``seq`` terminal was counted,
and a run forgotten and met again was counted with the row the core wrote last, not the
one of the highest version.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prism.pipeline.core import CoreConfig
from prism.pipeline.ingest import IngestSummary, ingest_lines, render_counts
from prism.runtime.simulator import FleetConfig, simulate
from tests.fixtures.final_ledger import FinalLedger
from tests.fixtures.runs import NOW, T0, RunBuilder

STALE_S = 30  # runs of the simulator go quiet for longer: incomplete, then running again


def _config(stale_s: float) -> CoreConfig:
    return CoreConfig(stale_after_s=stale_s, processing_grace=False)


def _ledger_counts(ledger: FinalLedger) -> dict[str, object]:
    """The summary's counts as the ledger's views give them."""
    quarantine = Counter(q.reason for q in ledger.rows("quarantine"))
    quarantine.update(q.reason for q in ledger.rows("channel_quarantine"))
    return {
        "runs": dict(Counter(r.status for r in ledger.rows("runs"))),
        "applied": len(ledger.rows("events")),
        "quarantine": dict(quarantine),
        "alerts": len(ledger.rows("alerts")),
        "denied": len(ledger.rows("channel_denials")),
        "stuck": sum(op.stuck for op in ledger.rows("channel_operations")),
    }


def _summary_counts(summary: IngestSummary) -> dict[str, object]:
    return {
        "runs": summary.runs_by_status,
        "applied": summary.stats["applied"],
        "quarantine": {
            k.split(".", 1)[1]: v for k, v in summary.stats.items() if k.startswith("quarantine.")
        },
        "alerts": summary.alerts,
        "denied": summary.stats["channel.denied"],
        "stuck": summary.stats["channel.stuck"],
    }


@st.composite
def replays(draw: st.DrawFn) -> tuple[FleetConfig, list[int]]:
    """A small chaotic fleet (its stale threshold short) and batch sizes to replay it in."""
    config = FleetConfig(
        runs=draw(st.integers(3, 25)),
        seed=draw(st.integers(0, 2**16)),
        duplicates=draw(st.sampled_from([0.0, 0.1])),
        reorder_window=draw(st.integers(0, 8)),
        post_terminal=draw(st.sampled_from([0.0, 0.3])),
        conflicting_terminals=draw(st.sampled_from([0.0, 0.3])),
        hostile=draw(st.sampled_from([0.0, 0.1])),
        malformed=draw(st.sampled_from([0.0, 0.05])),
        channel_operations=draw(st.sampled_from([0, 8])),
        stale_after_seconds=draw(st.sampled_from([STALE_S, 5, 120])),
    )
    return config, draw(st.lists(st.integers(1, 400), min_size=1, max_size=3))


def _without_alerts(summary: IngestSummary) -> str:
    """The summary but its alerts line: the core's stale-run alerts still depend on where
    batches cut (a run quiet for longer than the threshold between two of its events fires
    and resolves one line at a time, never in one batch), and the ledger holds what fired."""
    return "\n".join(v for v in summary.render().splitlines() if not v.startswith("alerts:"))


@settings(max_examples=50, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(replay=replays())
def test_the_summary_is_the_same_for_every_batch_size_and_is_the_ledgers(
    replay: tuple[FleetConfig, list[int]],
) -> None:
    fleet_config, sizes = replay
    fleet = simulate(fleet_config)
    lines = [r.value for r in fleet.records]
    config = _config(fleet_config.stale_after_seconds)
    clock = max(r.ts_ms for r in fleet.records) / 1000
    seen = set()
    for size in [len(lines), 1, *sizes]:
        ledger = FinalLedger()
        summary = ingest_lines(
            lines, source="file:f", store=ledger.add, config=config, batch_size=size,
            clock=lambda: clock,
        )  # fmt: skip
        assert _summary_counts(summary) == _ledger_counts(ledger), size
        seen.add(_without_alerts(summary))
        dry = ingest_lines(
            lines, source="file:f", store=None, config=config, batch_size=size, clock=lambda: clock
        )
        assert dry.render() == summary.render(), size  # a dry run says what a replay would
    assert len(seen) == 1, seen


def test_an_event_applied_and_then_retracted_is_not_counted() -> None:
    """A turn past the terminal, read before it: one line at a time it is applied, then
    retracted when the terminal arrives (rule 10); the ledger holds three events."""
    run = RunBuilder("r1").started().turn(1).finished().turn(2)
    lines = [orjson.dumps(run.events[i]) for i in (0, 1, 3, 2)]
    for size in (1, 2, 4):
        ledger = FinalLedger()
        summary = ingest_lines(
            lines, source="file:f", store=ledger.add, config=_config(3600), batch_size=size,
            clock=lambda: NOW,
        )  # fmt: skip
        assert summary.stats["applied"] == len(ledger.rows("events")) == 3, size
        assert summary.runs_by_status == {"succeeded": 1}
        assert render_counts(summary.stats, "quarantine") == "post_terminal=1"


def test_a_run_written_again_at_a_lower_version_counts_as_the_ledger_keeps_it() -> None:
    """A run closed and forgotten (its retention over) is met again by an error past its
    terminal: one line at a time the core starts it afresh and writes it ``failed`` at a
    lower version than its ``succeeded`` row, which the ledger keeps."""
    done = RunBuilder("done").started().turn(1).finished().error()  # seq 3: past the terminal
    later = RunBuilder("later", start=T0 + timedelta(minutes=10)).started().turn(1).finished()
    lines = [orjson.dumps(e) for e in [*done.events[:3], *later.events, done.events[3]]]
    config = CoreConfig(grace_period_s=1, tombstone_retention_s=60, processing_grace=False)
    for size in (1, len(lines)):
        ledger = FinalLedger()
        summary = ingest_lines(
            lines, source="file:f", store=ledger.add, config=config, batch_size=size,
            clock=lambda: NOW,
        )  # fmt: skip
        assert summary.runs_by_status == _ledger_counts(ledger)["runs"] == {"succeeded": 2}, size
