"""``Intake.parse_ahead``: a step takes what was parsed for it and nothing else.

The worker parses the next batch while this batch's insert waits on ClickHouse. Parsing is
a function of a value's bytes, so a step given results parsed ahead must produce exactly
the output it would have produced parsing them itself, whatever was parsed ahead: the
batch's values, some of them, equal bytes in other objects, or stale results.
"""

from __future__ import annotations

from typing import Any

import pytest

from bench.ledger_digest import CHAOS
from prism.pipeline.core import CoreConfig, InRecord, Intake, Output
from prism.runtime.simulator import FleetConfig, simulate

NOW = 1_800_000_000.0
TOPIC = "t.agent-events"
SIZE = 150


@pytest.fixture(scope="module")
def records() -> list[InRecord]:
    """A chaos fleet (malformed, oversized, duplicate and reordered values) on one partition."""
    fleet = simulate(FleetConfig(runs=80, seed=3, **CHAOS))  # type: ignore[arg-type]
    return [InRecord(r.value, TOPIC, 0, i, r.key) for i, r in enumerate(fleet.records)]


def _own_objects(records: list[InRecord]) -> list[InRecord]:
    """The records with each value an object of its own (the fleet repeats some objects)."""
    return [
        InRecord(bytes(bytearray(r.value)) if r.value else r.value, r.source, 0, r.offset, r.key)
        for r in records
    ]


def _seen(out: Output) -> tuple[Any, ...]:
    """Everything a step hands on: rows, topic records, state writes and counts."""
    return (
        out.ledger,
        out.dlq,
        out.quarantined,
        out.closed,
        out.alerts,
        out.state_writes,
        sorted(out.stats.items()),
    )


def _batches(records: list[InRecord]) -> list[list[InRecord]]:
    return [records[i : i + SIZE] for i in range(0, len(records), SIZE)]


def _steps(records: list[InRecord], ahead: Any = None) -> tuple[list[Any], Intake]:
    """The fleet stepped in batches; ``ahead(intake, batch, next_batch)`` runs before each."""
    intake = Intake(CoreConfig())
    batches = _batches(records)
    seen = []
    for i, batch in enumerate(batches):
        if ahead is not None:
            ahead(intake, batch, batches[i + 1] if i + 1 < len(batches) else [])
        seen.append(_seen(intake.step(0, batch, NOW)))
        intake.commit(0)
    return seen, intake


def _values(batch: list[InRecord]) -> list[bytes | None]:
    return [r.value for r in batch]


def _distinct(batch: list[InRecord]) -> int:
    """Non-empty value objects: a value delivered twice as one object is taken once (and
    parsed again for its second record), so no two records share a parsed result."""
    return len({id(r.value) for r in batch if r.value})


def test_a_step_gives_the_same_output_from_values_parsed_ahead(records: list[InRecord]) -> None:
    plain, _ = _steps(records)
    parsed, intake = _steps(records, lambda it, batch, _next: it.parse_ahead(_values(batch)))
    assert parsed == plain
    per_batch = [_distinct(b) for b in _batches(records)]
    assert intake.ahead_used == sum(per_batch)  # each value object came from parse_ahead once
    assert sum(per_batch) < sum(1 for r in records if r.value), "some values must repeat"
    assert any(out[1] for out in plain), "the fleet must dead-letter some values"


def test_only_the_same_bytes_objects_are_taken(records: list[InRecord]) -> None:
    """Equal bytes in another object, or values of a later batch, are parsed as usual."""
    records = _own_objects(records)
    plain, _ = _steps(records)

    def copies_and_the_next_batch(it: Intake, batch: list[InRecord], nxt: list[InRecord]) -> None:
        half = len(batch) // 2
        copies = [bytes(bytearray(v)) if v else v for v in _values(batch[:half])]
        it.parse_ahead(copies + _values(batch[half:]) + _values(nxt))

    parsed, intake = _steps(records, copies_and_the_next_batch)
    assert parsed == plain
    taken = sum(_distinct(b[len(b) // 2 :]) for b in _batches(records))
    assert intake.ahead_used == taken > 0


def test_a_result_is_taken_once_and_a_new_call_replaces_the_old(records: list[InRecord]) -> None:
    batch = records[:200]
    expected = _seen(Intake(CoreConfig()).step(0, batch, NOW))

    intake = Intake(CoreConfig())
    assert intake.parse_ahead(_values(batch)) == _distinct(batch)
    assert _seen(intake.step(0, batch, NOW)) == expected
    used = intake.ahead_used
    intake.rollback(0)  # a refused store: the step is undone and stepped again (bisection)
    assert _seen(intake.step(0, batch, NOW)) == expected
    assert intake.ahead_used == used  # parsed afresh, not taken twice

    intake.rollback(0)
    intake.parse_ahead(_values(batch))
    intake.parse_ahead(_values(records[200:260]))  # the next call: the earlier results go
    assert _seen(intake.step(0, batch, NOW)) == expected
    assert intake.ahead_used == used


def test_slices_pause_between_them_and_a_stop_leaves_the_rest_to_the_step(
    records: list[InRecord],
) -> None:
    batch = _own_objects(records[:300])
    values = _values(batch)
    expected = _seen(Intake(CoreConfig()).step(0, batch, NOW))

    sliced = Intake(CoreConfig())
    pauses: list[int] = []
    assert sliced.parse_ahead(values, slice_size=64, between=lambda: pauses.append(1)) == 300
    assert len(pauses) == 5  # after each slice of 64: 300 values
    assert _seen(sliced.step(0, batch, NOW)) == expected
    assert sliced.ahead_used == 300

    stopped = Intake(CoreConfig())
    slices: list[int] = []

    def stop() -> bool:  # the next step begins after two slices
        slices.append(1)
        return len(slices) > 2

    assert stopped.parse_ahead(values, slice_size=64, stop=stop) == 128
    assert _seen(stopped.step(0, batch, NOW)) == expected  # the step parsed the other 172
    assert stopped.ahead_used == 128
