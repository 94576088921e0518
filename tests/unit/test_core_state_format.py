"""The stored lane state: one parse of its keys, a format version in every row it writes.

Rows without a version are of the format before and still load; a row of a newer format
than this code is refused with its key and both versions named, never read half-way.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import fields

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prism.pipeline.core import (
    STATE_FORMAT,
    CoreConfig,
    InRecord,
    Intake,
    Output,
    RunState,
    StateFormatError,
    StateKey,
    store_isolating,
)
from prism.pipeline.core._run import id_hash
from prism.runtime.simulator import FleetConfig, simulate

NOW = 2_000_000_000.0


@given(
    st.sampled_from(["r", "c", "m", "cm"]),
    st.integers(-1, 10_000),
    st.none() | st.text(min_size=1).filter(lambda s: "\x00" not in s),
)
def test_a_key_parses_back_to_what_made_it(kind: str, lane: int, name: str | None) -> None:
    key = StateKey(kind, lane, name)
    assert StateKey.parse(str(key)) == key
    assert StateKey.parse(str(key).encode()) == key


@pytest.mark.parametrize("raw", ["", "r", "slot-position", "r\x1fseven\x1frun-1"])
def test_a_key_that_is_no_lane_key_is_refused_by_name(raw: str) -> None:
    with pytest.raises(StateFormatError, match="state key"):
        StateKey.parse(raw)
    assert StateKey.of(raw) is None


def _fleet_writes() -> tuple[Intake, dict[str, bytes]]:
    fleet = simulate(FleetConfig(runs=40, seed=5, channel_operations=10))
    intake = Intake(CoreConfig(processing_grace=False))
    recs = [InRecord(r.value, "t", 0, i) for i, r in enumerate(fleet.records)]
    out = store_isolating(intake, {0: recs}, NOW, lambda _: None)
    writes = {k: v for k, v in out.state_writes.items() if v is not None}
    return intake, writes


def test_every_row_a_step_writes_has_a_parsed_key_and_the_current_format() -> None:
    _, writes = _fleet_writes()
    kinds = {StateKey.parse(k).kind for k in writes}
    assert {"r", "m"} <= kinds  # runs and the lane's meta record at least
    for key, value in writes.items():
        assert StateKey.parse(key).lane == 0
        assert orjson.loads(value)["v"] == STATE_FORMAT, key


def _runs(intake: Intake) -> dict[str, bytes]:
    return {k: v.to_bytes() for k, v in intake.processor(0).thawed().items()}


def test_rows_of_the_format_before_load_as_they_always_did() -> None:
    intake, writes = _fleet_writes()
    old = {}
    for key, value in writes.items():
        row = orjson.loads(value)
        del row["v"]
        old[key] = orjson.dumps(row)
    again = Intake(CoreConfig(processing_grace=False))
    again.load(0, old.items())
    assert _runs(again) == _runs(intake)
    assert again.clock.mark(0) == intake.clock.mark(0)


def _format_2(value: bytes) -> bytes:
    """A run row as format 2 wrote it: each fact with its envelope inline."""
    row = orjson.loads(value)
    facts, emitted, turns, envelopes = row["b"]
    for fact in facts.values():
        fact["e"] = envelopes[fact["e"]]
    return orjson.dumps({**row, "v": 2, "b": [facts, emitted, turns]})


def test_runs_of_format_2_load_as_they_did_and_share_their_envelopes_once_read() -> None:
    intake, writes = _fleet_writes()
    runs = {k: v for k, v in writes.items() if StateKey.parse(k).kind == "r"}
    assert all(len(orjson.loads(v)["b"][3]) == 1 for v in runs.values())
    old = {k: _format_2(v) if k in runs else v for k, v in writes.items()}
    assert sum(map(len, runs.values())) < 0.75 * sum(len(old[k]) for k in runs)
    again = Intake(CoreConfig(processing_grace=False))
    again.load(0, old.items())
    assert _runs(again) == _runs(intake)
    # a run whose events disagree on their envelope (an owner re-stated, rule 11)
    run = next(r for r in again.processor(0).thawed().values() if len(r.facts) > 2)
    first = next(iter(run.facts))
    run.facts[first] = {**run.facts[first], "e": {**run.facts[first]["e"], "user_id": "u-2"}}
    raw = run.to_bytes()
    assert len(orjson.loads(raw)["b"][3]) == 2
    read = RunState.from_bytes(raw)
    assert read.facts == run.facts
    assert len({id(f["e"]) for f in read.facts.values()}) == 2  # one object per envelope
    assert RunState.from_bytes(_format_2(raw)).facts == run.facts


def test_a_row_of_a_newer_format_is_refused_with_its_key_and_versions() -> None:
    _, writes = _fleet_writes()
    key = next(k for k in writes if StateKey.parse(k).kind == "r")
    newer = dict(writes)
    newer[key] = orjson.dumps({**orjson.loads(writes[key]), "v": STATE_FORMAT + 1})
    run = StateKey.parse(key).name
    versions = f"format {STATE_FORMAT + 1}; this release reads formats up to {STATE_FORMAT}"
    with pytest.raises(StateFormatError, match=re.escape(f"'run {run}' is of {versions}")):
        Intake().load(0, newer.items())
    meta = next(k for k in writes if StateKey.parse(k).kind == "m")
    newer = dict(writes)
    newer[meta] = orjson.dumps({**orjson.loads(writes[meta]), "v": STATE_FORMAT + 1})
    with pytest.raises(StateFormatError, match=re.escape(f"{meta!r} is of {versions}")):
        Intake().load(0, newer.items())


_SHORT = CoreConfig(
    processing_grace=False, grace_period_s=2.0, stale_after_s=60.0, tombstone_retention_s=30.0
)


def _live(run: RunState) -> bool:
    """Waiting to close, or open: the runs a restore decodes."""
    if run.terminal is not None:
        return not run.closed
    return not run.incomplete


def _records(fleet_seed: int) -> list[InRecord]:
    fleet = simulate(FleetConfig(runs=60, seed=fleet_seed, channel_operations=8))
    return [InRecord(r.value, "t", 0, i) for i, r in enumerate(fleet.records)]


def _digest(out: Output) -> tuple[object, ...]:
    return (
        {f.name: sorted(map(repr, getattr(out.ledger, f.name))) for f in fields(out.ledger)},
        sorted(map(repr, out.quarantined)),
        sorted(map(repr, out.closed)),
        sorted(map(repr, out.limit_deaths)),
        sorted(out.state_writes.items(), key=lambda kv: kv[0]),
    )


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 5), st.floats(0.05, 0.95))
def test_a_lane_restored_cold_steps_on_exactly_as_one_decoded_whole(seed: int, cut: float) -> None:
    """Restoring decodes only the runs still open or closing; the others stay in their
    stored bytes until an event, a shrink or a retirement asks for them. Stepping the rest
    of the fleet on such a lane gives the same rows, records and state writes as on a lane
    whose every run was decoded at the restore (what the format before did)."""
    recs = _records(seed)
    k = int(len(recs) * cut)
    first = Intake(_SHORT)
    out = store_isolating(first, {0: recs[:k]}, NOW, lambda _: None)
    state = [(key, v) for key, v in out.state_writes.items() if v is not None]

    lazy, whole = Intake(_SHORT), Intake(_SHORT)
    lazy.load(0, state)
    whole.load(0, state)
    whole.processor(0).thawed()
    proc = lazy.processor(0)
    assert set(proc.runs) == {r for r, run in whole.processor(0).runs.items() if _live(run)}
    assert proc.size == whole.processor(0).size

    rest = recs[k:]
    a = store_isolating(lazy, {0: rest}, NOW + 10, lambda _: None)
    b = store_isolating(whole, {0: rest}, NOW + 10, lambda _: None)
    assert _digest(a) == _digest(b)
    assert {k: v.to_bytes() for k, v in lazy.processor(0).thawed().items()} == {
        k: v.to_bytes() for k, v in whole.processor(0).thawed().items()
    }


def test_restoring_a_lane_decodes_only_its_live_runs() -> None:
    recs = _records(3)
    first = Intake(_SHORT)
    out = store_isolating(first, {0: recs}, NOW, lambda _: None)
    state = [(key, v) for key, v in out.state_writes.items() if v is not None]
    again = Intake(_SHORT)
    again.load(0, state)
    proc = again.processor(0)
    stored_runs = sum(1 for key, _ in state if StateKey.parse(key).kind == "r")
    assert proc.size == stored_runs
    assert 0 < len(proc.runs) < stored_runs  # the closed and incomplete ones wait cold
    assert all(_live(run) for run in proc.runs.values())
    assert len(proc.thawed()) == stored_runs


@pytest.mark.pure_core
@settings(max_examples=20, deadline=None)
@given(st.integers(0, 5), st.integers(7, 300), st.lists(st.booleans(), min_size=1, max_size=40))
def test_runs_at_rest_in_their_bytes_step_on_exactly_as_decoded_ones(
    seed: int, batch: int, undo: list[bool]
) -> None:
    """A run that closes (or goes incomplete) rests in its state record's bytes until it
    is next asked for (``_rests``). A lane that keeps every run decoded writes the same
    rows, records and state, batch by batch, including a step rolled back and stepped
    again (the rollback voids the bytes the step put to rest). A closed run shrinks at
    rest to the record made when it was put to rest, without being decoded
    (``_replace_resting``); the decoded lane shrinks its runs as they are."""
    recs = _records(seed)
    resting, decoded = Intake(_SHORT), Intake(_SHORT)
    decoded.processor(0)._rests = lambda item: False  # type: ignore[method-assign]
    at_rest = resting.processor(0)
    shrunk_at_rest: list[str] = []
    replace = at_rest._replace_resting

    def counted(key: str, raw: bytes, index: object) -> None:
        shrunk_at_rest.append(key)
        replace(key, raw, index)

    at_rest._replace_resting = counted  # type: ignore[method-assign]
    rested = 0
    for n, start in enumerate(range(0, len(recs), batch)):
        part = recs[start : start + batch]
        outs = []
        for intake in (resting, decoded):
            if undo[n % len(undo)]:
                intake.step(0, part, NOW + n)
                intake.rollback(0)
            outs.append(intake.step(0, part, NOW + n))
            intake.commit(0)
        assert _digest(outs[0]) == _digest(outs[1])
        proc = resting.processor(0)
        assert not set(proc.items) & set(proc._cold)  # a key is decoded or at rest, not both
        rested = max(rested, len(proc._cold))
    assert rested > 0 and not decoded.processor(0)._cold
    assert shrunk_at_rest  # the shrink at rest was taken, and wrote what decoding writes
    assert {k: v.to_bytes() for k, v in resting.processor(0).thawed().items()} == {
        k: v.to_bytes() for k, v in decoded.processor(0).thawed().items()
    }


@given(st.text(max_size=80))
def test_a_tombstones_id_hash_is_blake2bs_8_byte_digest_halved(event_id: str) -> None:
    """Tombstones store these hashes: written by one version, read by the next."""
    digest = hashlib.blake2b(event_id.encode(), digest_size=8).digest()
    assert id_hash(event_id) == int.from_bytes(digest) >> 1
    assert id_hash("evt-1") == 6854961599494532643  # pinned: the stored form never moves
