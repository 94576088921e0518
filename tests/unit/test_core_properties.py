"""Properties of the core, searched by hypothesis (schemas/CONTRACT.md rules 10, 13, 15).

1. Order independence: any permutation, duplication and batch split of a fleet's records,
   over any number of partitions and of file invocations (state saved in between), gives
   the ledger in-order delivery gives: runs, turns, usage, billing, quarantine.
2. Accounting: every input record ends in exactly one of the ledger, quarantine or DLQ.
3. Hostile values never raise, never hang, and are accounted for too.

``make test`` runs the ``ci`` profile (fixed seed, bounded examples); pass
``--hypothesis-profile=deep`` for a longer search.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prism.pipeline.core import CoreConfig, InRecord
from tests.fixtures.final_ledger import FinalLedger, feed_stream
from tests.fixtures.hostile import Fleet, fleets, hostile_values
from tests.fixtures.runs import NOW, RunBuilder

# Grace longer than any fleet's span: closes wait for gaps or the end, never on timing.
CFG = CoreConfig(
    grace_period_s=86400,
    stale_after_s=3600,
    tombstone_retention_s=30 * 86400,
    processing_grace=False,
)
SOURCE = "prism.agent-events"


def _partition(value: bytes, partitions: int) -> int:
    """Kafka keys records by runId, so one run's records share a partition."""
    try:
        run_id = orjson.loads(value).get("runId")
    except (orjson.JSONDecodeError, AttributeError):
        run_id = None
    return zlib.crc32(str(run_id).encode()) % partitions


def deliver(
    values: Sequence[bytes],
    *,
    partitions: int = 1,
    batch_sizes: Sequence[int] = (10**6,),
    invocations: Sequence[int] = (),
) -> tuple[FinalLedger, list[InRecord]]:
    """Feed ``values`` as a pipeline would (``feed_stream``, records keyed by run)."""
    return feed_stream(
        values,
        config=CFG,
        source=SOURCE,
        partition_of=_partition,
        now=NOW,
        partitions=partitions,
        batch_sizes=batch_sizes,
        invocations=invocations,
    )


def _meaning(ledger: FinalLedger) -> dict[str, object]:
    snap = ledger.snapshot()
    dead = snap.pop("dead_letters")
    return {**snap, "dead_letters": sorted(set(dead)), "billing": ledger.billing()}


@st.composite
def deliveries_of(draw: st.DrawFn, fleet: Fleet) -> dict[str, object]:
    """A hostile delivery of ``fleet``: permuted, with duplicates, batches, partitions."""
    values = list(draw(st.permutations(fleet)))
    for _ in range(draw(st.integers(0, 4))):
        values.insert(draw(st.integers(0, len(values))), draw(st.sampled_from(fleet)))
    return {
        "values": values,
        "partitions": draw(st.integers(1, 3)),
        "batch_sizes": draw(st.lists(st.integers(1, 8), min_size=1, max_size=3)),
        "invocations": draw(st.lists(st.integers(0, len(values)), max_size=2)),
    }


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), fleet=fleets())
def test_the_ledger_is_a_function_of_the_set_of_events(data: st.DataObject, fleet: Fleet) -> None:
    baseline, _ = deliver(fleet)
    how = data.draw(deliveries_of(fleet))
    values = how.pop("values")
    ledger, _ = deliver(values, **how)  # type: ignore[arg-type]
    assert _meaning(ledger) == _meaning(baseline)


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), fleet=fleets())
def test_every_record_ends_in_exactly_one_place(data: st.DataObject, fleet: Fleet) -> None:
    how = data.draw(deliveries_of(fleet))
    values = how.pop("values")
    ledger, fed = deliver(values, **how)  # type: ignore[arg-type]
    _assert_accounted(ledger, fed)
    _assert_billing_rules(ledger)


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(values=st.lists(hostile_values(), min_size=1, max_size=6))
def test_hostile_values_never_raise_and_are_accounted_for(values: list[bytes]) -> None:
    ledger, fed = deliver(values, batch_sizes=(3,))
    _assert_accounted(ledger, fed)
    for usage in ledger.rows("usage"):  # whatever was accepted fits the ledger's columns
        for tokens in (usage.input_tokens, usage.output_tokens, usage.total_tokens):
            assert tokens is None or 0 <= tokens < 2**53
        assert usage.cost is None or 0 <= usage.cost < 10**15


def test_an_event_id_given_to_an_event_of_another_run_is_judged_in_each_run() -> None:
    """A hostile record put ``victim-e1``, an event of a run it cannot bill into, in another
    run as well (found by the deep profile). Each is judged in its own run: one is applied
    there, the other quarantined, and each record ends in one place."""
    victim = RunBuilder("victim", tenant="owner").started()
    intruder = RunBuilder("victim", tenant="acme").started().turn(1).events[1]
    values = [orjson.dumps(ev) for ev in (victim.events[0], {**intruder, "runId": "other"},
                                          intruder)]  # fmt: skip
    ledger, fed = deliver(values, batch_sizes=(3,))
    assert {(e.run_id, e.event_id) for e in ledger.rows("events")} == {
        ("victim", "victim-e0"),
        ("other", "victim-e1"),
    }
    assert [(q.run_id, q.event_id, q.reason) for q in ledger.rows("quarantine")] == [
        ("victim", "victim-e1", "tenant_mismatch")
    ]
    _assert_accounted(ledger, fed)


def _assert_billing_rules(ledger: FinalLedger) -> None:
    """Rules 2, 11 and 12 on the final ledger, whatever the delivery."""
    runs = {r.run_id: r for r in ledger.rows("runs")}
    seen: set[tuple[str, int | None, int | None]] = set()
    for u in ledger.rows("usage"):
        run = runs[u.run_id]
        if run.terminal_seq is not None:  # nothing above the terminal counts
            assert u.seq < run.terminal_seq, (u.event_id, u.seq, run.terminal_seq)
        assert u.tenant_id == run.tenant_id  # billed to the run's owner, never to no one
        if u.scope == "provider_turn" and not u.estimated:
            key = (u.run_id, u.turn, u.attempt)
            assert key not in seen, key  # one reported usage per turn attempt
            seen.add(key)
    for e in ledger.rows("events"):
        run = runs[e.run_id]
        assert run.terminal_seq is None or e.seq <= run.terminal_seq
        assert e.tenant_id == run.tenant_id


def _assert_accounted(ledger: FinalLedger, fed: list[InRecord]) -> None:
    """Each record: a dead letter at its position, or its event (run and id) in the ledger
    xor quarantine."""
    dead = {(d.source, d.partition, d.offset) for d in ledger.rows("dead_letters")}
    accepted, quarantined = ledger.placed_events()
    assert not accepted & quarantined
    for rec in fed:
        if (rec.source, rec.partition, rec.offset) in dead:
            continue
        ev = orjson.loads(rec.value or b"{}")
        event = (ev["runId"], ev["eventId"])
        assert (event in accepted) != (event in quarantined), event
