"""Which of two claims of one seq counts is a function of the set, not of arrival (rule 10).

A producer that re-sends an event under a new ``eventId`` (a retry that mints ids, a
second producer replaying a run) makes two claims of one ``(runId, seq)``; rule 1 says
the other one changes nothing, rule 10 that which one counts cannot depend on which
arrived first: a run split over partitions by its producers, or read by several
workers, sees its events in other orders than the file. Between claims carrying the same
tenant field, the smaller ``eventId`` holds the seq. Claims carrying another tenant keep
rule 11's protection: the run's first event fixes the owner, whatever ids the other
tenant picks (``tests/unit/test_core_hostile.py``).
"""

from __future__ import annotations

import itertools
from decimal import Decimal
from typing import Any

from tests.fixtures.runs import RunBuilder
from tests.unit.test_core_hostile import USD, replay


def _run_with_duplicates() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A run, and three re-sends under new ids: the same turn, a usage with other figures
    (a priced row: the bill must not depend on which arrives first), the terminal."""
    b = RunBuilder("r1").started()
    b.turn(1).usage(turn=1, attempt=1, inputTokens=100, outputTokens=10, **USD)
    b.finished()
    ev = b.events
    again = [
        ev[1] | {"eventId": "a-turn-again"},
        ev[2] | {"eventId": "a-usage-again", "data": ev[2]["data"] | {
            "usage": {"inputTokens": 999, "outputTokens": 99, **USD}}},
        ev[3] | {"eventId": "zz-finished-again"},
    ]  # fmt: skip
    return ev, again


def test_duplicate_claims_of_a_seq_give_one_ledger_in_every_order() -> None:
    ev, again = _run_with_duplicates()
    pool = [ev[1], ev[2], ev[3], *again]
    seen = set()
    for order in itertools.permutations(pool):
        ledger = replay([ev[0]], list(order))
        seen.add(repr(ledger.snapshot()))
        # the smaller id of each pair holds its seq: the re-sent turn and usage ("a-..."
        # sorts before "r1-..."), the original terminal ("r1-e3" before "zz-...")
        assert ledger.reasons() == {
            "r1-e1": "duplicate_seq",
            "r1-e2": "duplicate_seq",
            "zz-finished-again": "duplicate_seq",
        }
        assert ledger.billing() == {("acme", "USD"): (999, 99, Decimal("0.50"))}
        assert ledger.status("r1") == "succeeded"
    assert len(seen) == 1


def test_a_smaller_id_arriving_after_its_seq_was_billed_takes_it_over_by_retraction() -> None:
    ev, again = _run_with_duplicates()
    first = replay(ev)  # the originals alone: billed 100 tokens
    assert first.billing() == {("acme", "USD"): (100, 10, Decimal("0.50"))}
    later = replay(ev, [again[1]])  # the re-send with the smaller id comes last
    assert later.billing() == {("acme", "USD"): (999, 99, Decimal("0.50"))}
    stored = later.tables["usage"]
    assert [u.retracted for k, u in stored.items() if k[2] == "r1-e2"] == [True]
    assert later.reasons() == {"r1-e2": "duplicate_seq"}
