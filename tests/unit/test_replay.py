"""Pure parts of the replay consumers: run sequencer, partitioning, formatting, CLI checks."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from aiokafka.partitioner import DefaultPartitioner

from prism.pipeline.cli import main
from prism.pipeline.replay import (
    ReplayEvent,
    RunSequencer,
    event_from_ledger_row,
    event_from_record,
    format_event,
    format_seqs,
    partition_for,
)
from tests.fixtures.runs import RunBuilder


def events(envelopes: list[dict[str, Any]]) -> list[ReplayEvent]:
    return [event_from_record(orjson.dumps(e)) for e in envelopes]


def a_run(run_id: str = "r1") -> list[ReplayEvent]:
    """seq 0..5, terminal (agent_finished) at 5."""
    b = RunBuilder(run_id).started().turn(1).turn(2).usage(turn=2, attempt=1, inputTokens=10)
    return events(b.turn(3).finished().events)


def replay(seq: RunSequencer, evs: list[ReplayEvent]) -> list[int]:
    return [ready.seq for ev in evs for ready in seq.push(ev)]


def test_out_of_order_and_duplicated_events_come_out_once_in_seq_order() -> None:
    evs = a_run()
    shuffled = [evs[2], evs[0], evs[4], evs[2], evs[1], evs[0], evs[5], evs[3], evs[3]]
    seq = RunSequencer("r1")
    assert replay(seq, shuffled) == [0, 1, 2, 3, 4, 5]
    assert seq.complete
    assert seq.result().duplicates == 3


def test_nothing_past_a_gap_is_released_until_it_is_filled() -> None:
    evs = a_run()
    seq = RunSequencer("r1")
    assert replay(seq, [evs[0], evs[2], evs[5]]) == [0]
    assert not seq.complete
    assert seq.missing() == [(1, 1), (3, 4)]
    assert replay(seq, [evs[1]]) == [1, 2]
    assert replay(seq, [evs[4], evs[3]]) == [3, 4, 5]
    assert seq.complete and seq.missing() == []


def test_same_seq_with_another_event_id_is_a_duplicate() -> None:
    evs = a_run()
    other = ReplayEvent("r1", 1, "someone-else", "tool_call_finished", evs[1].ts, "acme", {})
    seq = RunSequencer("r1")
    assert replay(seq, [evs[0], evs[1], other]) == [0, 1]
    assert seq.duplicates == 1


def test_post_terminal_events_are_never_released() -> None:
    b = RunBuilder("r1").started().turn(1).finished()
    b.add(
        "tool_call_finished",
        {"turn": 1, "tool": "x", "callIdHash": "h", "durationMs": 1, "ok": True},
    )
    evs = events(b.events)  # seq 3 lies above the terminal at seq 2
    seq = RunSequencer("r1")
    assert replay(seq, [evs[3], evs[2], evs[0], evs[1]]) == [0, 1, 2]
    assert seq.complete
    assert seq.result().post_terminal == 1
    assert replay(seq, [evs[3]]) == []


def test_the_lowest_terminal_wins() -> None:
    b = RunBuilder("r1").started().turn(1).error().turn(2).finished()
    evs = events(b.events)  # error at seq 2, a conflicting agent_finished at seq 4
    seq = RunSequencer("r1")
    assert replay(seq, [evs[4], evs[3], evs[0], evs[2]]) == [0]
    assert seq.terminal_seq == 2
    assert replay(seq, [evs[1]]) == [1, 2]
    result = seq.result()
    assert (result.complete, result.terminal_type, result.post_terminal) == (True, "error", 2)


def test_events_of_other_runs_are_ignored() -> None:
    seq = RunSequencer("r1")
    assert replay(seq, a_run("r2")) == []
    assert seq.released == 0


def test_giving_up_releases_what_waits_behind_a_gap_and_lists_the_gap() -> None:
    evs = a_run()
    seq = RunSequencer("r1")
    replay(seq, [evs[0], evs[3], evs[5], evs[4]])
    assert [e.seq for e in seq.drain()] == [3, 4, 5]
    result = seq.result()
    assert (result.complete, result.missing, result.printed) == (False, [(1, 2)], 4)
    assert "missing seqs: 1-2" in result.describe()


def test_without_a_terminal_the_gaps_below_the_highest_seq_are_listed() -> None:
    evs = a_run()
    seq = RunSequencer("r1")
    replay(seq, [evs[0], evs[2]])
    assert seq.missing() == [(1, 1)]
    assert "no terminal event yet" in seq.result().describe()


@pytest.mark.parametrize("partitions", [1, 3, 4, 12])
def test_partition_for_matches_the_default_partitioner(partitions: int) -> None:
    rng = random.Random(7)
    ids = [f"run-{rng.getrandbits(64):x}" for _ in range(200)] + ["r", "é-run", "x" * 128]
    expected = [DefaultPartitioner()(i.encode(), list(range(partitions)), []) for i in ids]
    assert [partition_for(i, partitions) for i in ids] == expected


def test_jsonl_prints_the_record_as_produced() -> None:
    env = RunBuilder("r1").started().events[0]
    env["futureField"] = {"kept": True}  # unknown envelope fields are kept on output
    line = format_event(event_from_record(orjson.dumps(env)), "jsonl")
    assert orjson.loads(line) == env


def test_pretty_names_the_seq_type_and_payload() -> None:
    ev = events(RunBuilder("r1").started().turn(1).events)[1]
    line = format_event(ev, "pretty", with_run=True)
    assert line.split()[:4] == ["r1", "acme", "1", ev.ts.isoformat()]
    assert "provider_turn_finished" in line and "turn=1" in line and "budgets.turns=1" in line
    last = events(RunBuilder("r1").started().finished().events)[1]
    assert format_event(last, "pretty").endswith("[terminal]")


def test_a_ledger_row_becomes_an_envelope() -> None:
    row = {
        "event_id": "e1", "run_id": "r1", "seq": 3, "type": "agent_finished",
        "ts": datetime(2026, 11, 30, 10, 0, 3), "tenant_id": "acme", "account_id": None,
        "user_id": None, "session_id": "s1", "agent_id": "agent-1", "provider": "anthropic",
        "model": "claude-x", "parent_run_id": None, "bundle_digest": None,
        "payload": '{"finishReason":"stop"}', "partition": 2, "offset": 41,
    }  # fmt: skip
    ev = event_from_ledger_row(row)
    assert (ev.seq, ev.is_terminal, ev.offset, ev.ts.tzinfo) == (3, True, 41, UTC)
    assert ev.envelope["data"] == {"finishReason": "stop"}
    assert ev.envelope["model"] == {"provider": "anthropic", "model": "claude-x"}
    assert "accountId" not in ev.envelope and ev.envelope["sessionId"] == "s1"
    assert ev.envelope["ts"] == "2026-11-30T10:00:03+00:00"


def test_format_seqs_compacts_ranges() -> None:
    assert format_seqs([(1, 3), (7, 7), (9, 10)]) == "1-3, 7, 9-10"
    assert format_seqs([]) == ""


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["tail", "--run", "r1", "--tenant", "acme"], "--tenant only apply with --follow"),
        (["tail", "--follow", "--from-ledger"], "only apply with --run"),
        (["tail", "--run", "r1", "--timeout", "0"], "--timeout must be"),
        (["rebuild", "--batch-size", "0"], "--batch-size must be >= 1"),
    ],
)
def test_cli_refuses_options_that_do_not_fit(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_the_public_surface_is_exported() -> None:
    import types

    import prism.pipeline.replay as replay

    assert [n for n in replay.__all__ if not hasattr(replay, n) or n.startswith("_")] == []
    public = {
        n
        for n in dir(replay)
        if not n.startswith("_") and not isinstance(getattr(replay, n), types.ModuleType)
    }
    assert public == set(replay.__all__)
