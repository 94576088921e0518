"""Rows a step stored but never committed are outranked by the next owner's (rule 17).

The worker inserts a batch's rows, then commits the slot's Kafka transaction. A crash or a
fence between the two leaves rows in the ledger that the committed state never saw; the
next owner steps the same records again from the committed state, but cut into other
batches (the consumer fetched more, copies interleaved differently), so it need not write
the same rows at the same versions. Seen in the chaos soak: the first owner applied the
only claim of a seq it had seen; the next owner, seeing both claims at once, quarantined
that one from the start, never wrote its raw row, and the first owner's counted row
stayed in the ledger. Now a new owner's generation rides above every version it writes,
and an event quarantined the first time a state sees it has its rows written retracted.
"""

from __future__ import annotations

from typing import Any

import orjson

from prism.pipeline.core import CoreConfig, InRecord, Intake, Output, store_isolating
from prism.pipeline.core._keyed import GENERATION_SHIFT
from tests.fixtures.events import event_bytes, make_event

NOW = 1_800_000_000.0
INPUT, COPIES = "in", "in.repartition"


def _rec(seq: int, event_id: str, offset: int, source: str = INPUT, **data: Any) -> InRecord:
    ev = make_event("provider_turn_finished" if seq else "agent_started", "r", seq, **data)
    ev["eventId"] = event_id
    return InRecord(event_bytes(ev), source, 0, offset)


class _Ledger:
    """One server's tables: the highest version of each key wins (ReplacingMergeTree)."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], tuple[int, Any]] = {}

    def store(self, out: Output) -> None:
        for table, rows in (("events", out.ledger.events), ("usage", out.ledger.usage),
                            ("quarantine", out.ledger.quarantine)):  # fmt: skip
            for row in rows:
                key = (table, row.event_id)
                if key not in self.rows or self.rows[key][0] <= row.version:
                    self.rows[key] = (row.version, row)

    def counted(self, table: str) -> set[str]:
        return {k[1] for k, (_, row) in self.rows.items() if k[0] == table and not row.retracted}


def _intake(generation: int) -> Intake:
    intake = Intake(CoreConfig(processing_grace=False))
    intake.set_generation(0, generation)
    return intake


def _first_owner_stepped(ledger: _Ledger) -> None:
    """Saw the larger-id claim of seq 1 only, and two more events: stored, never committed."""
    a = _intake(generation=1)
    batch = [_rec(0, "e0", 0), _rec(1, "e1-b", 1), _rec(2, "e2", 2), _rec(3, "e3", 3)]
    store_isolating(a, {0: batch}, NOW, ledger.store)


def test_the_next_owner_retracts_a_claim_the_first_owner_stored_and_never_committed() -> None:
    ledger = _Ledger()
    _first_owner_stepped(ledger)
    assert "e1-b" in ledger.counted("events")
    b = _intake(generation=2)  # restored from the committed state: empty
    store_isolating(b, {0: [_rec(0, "e0", 0), _rec(1, "e1-b", 1)]}, NOW + 20, ledger.store)
    store_isolating(b, {0: [_rec(1, "e1-a", 0, COPIES)]}, NOW + 20, ledger.store, forwarded=True)
    store_isolating(b, {0: [_rec(2, "e2", 2), _rec(3, "e3", 3)]}, NOW + 20, ledger.store)
    assert ledger.counted("events") == {"e0", "e1-a", "e2", "e3"}
    assert "e1-b" in ledger.counted("quarantine")
    file_path = _Ledger()  # one intake, every record at once: what the ledger must equal
    recs = [_rec(0, "e0", 0), _rec(1, "e1-b", 1), _rec(2, "e2", 2), _rec(3, "e3", 3)]
    store_isolating(_intake(0), {0: [*recs, _rec(1, "e1-a", 4)]}, NOW, file_path.store)
    for table in ("events", "usage", "quarantine"):
        assert ledger.counted(table) == file_path.counted(table), table


def test_an_event_quarantined_at_first_sight_still_has_its_rows_written_retracted() -> None:
    intake = _intake(generation=0)
    out = store_isolating(
        intake, {0: [_rec(0, "e0", 0), _rec(1, "e1-a", 1), _rec(1, "e1-b", 2)]}, NOW,
        lambda _: None,
    )  # fmt: skip
    retracted = {r.event_id for r in out.ledger.events if r.retracted}
    assert retracted == {"e1-b"}
    assert {r.event_id for r in out.ledger.quarantine if not r.retracted} == {"e1-b"}
    assert out.stats["retracted"] == 0  # nothing that counted left a view


def test_a_channel_record_accepted_at_first_sight_retracts_any_quarantine_row_of_it() -> None:
    # an earlier owner that saw the operation's later transition without the one before
    # stored it quarantined (illegal_transition) and never committed; the next owner,
    # seeing both, accepts it and must leave no quarantine row of it standing
    rec = {
        "schema": "prism.channel-operation/v1",
        "eventId": "op1-0",
        "operationId": "op1",
        "seq": 0,
        "ts": "2026-11-30T10:00:00+00:00",
        "connectionId": "telegram:main",
        "kind": "message",
        "state": "admitted",
    }
    intake = _intake(generation=3)
    out = store_isolating(
        intake, {0: [InRecord(orjson.dumps(rec), "ops", 0, 0)]}, NOW, lambda _: None
    )
    rows = [(q.event_id, q.retracted, q.version >> GENERATION_SHIFT)
            for q in out.ledger.channel_quarantine]  # fmt: skip
    assert rows == [("op1-0", True, 3)]
    assert [o.version >> GENERATION_SHIFT for o in out.ledger.channel_operations] == [3]
