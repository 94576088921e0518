"""``bench.ledger_digest``: the tool that shows a change left the bill row-for-row the same."""

from __future__ import annotations

import pytest

from bench.ledger_digest import digest

pytestmark = pytest.mark.integration


def test_the_same_fleet_gives_the_same_digest_and_another_fleet_does_not() -> None:
    first = digest(1000, batch=400, chaos=True)
    assert digest(1000, batch=400, chaos=True) == first
    for table in ("run_events_store", "runs_store", "usage_store", "quarantine_store"):
        assert first[table][0] > 0, f"{table} is empty: the digest would prove nothing"
    plain = digest(1000, batch=400)
    assert plain["run_events_store"] != first["run_events_store"]
    assert plain["quarantine_store"][0] == 0 < first["quarantine_store"][0]


def test_the_views_are_the_same_whatever_the_batch_size() -> None:
    """Storage tables keep each row's versions, which depend on where batches cut; the views
    users query do not (rule 10), stale-run alerts included: they fire at the event time
    the run went stale, not at the watermark of the batch that noticed."""
    small = digest(2000, batch=300, chaos=True, views=True)
    large = digest(2000, batch=1000, chaos=True, views=True)
    assert small == large
    for view in ("runs", "billing_usage", "quarantine", "dead_letters", "alerts"):
        assert small[view][0] > 0, f"{view} is empty: the digest would prove nothing"
    storage = digest(2000, batch=300, chaos=True), digest(2000, batch=1000, chaos=True)
    assert storage[0]["runs_store"] != storage[1]["runs_store"]  # versions differ, views not
    plain = digest(2000, batch=300, views=True)
    assert plain["quarantine"][0] == 0 < small["quarantine"][0]


def test_the_billing_rollup_gives_the_rows_bill_and_rows_stored_again_count_once() -> None:
    """The fast path (day rollup) and the FINAL reference digest alike on a chaos fleet,
    and again after every usage row was stored twice more (a re-delivered insert and a
    folded ledger)."""
    found = digest(3000, batch=400, chaos=True, billing=True)
    assert found["billing_rollup_months"][0] > 0, "the rollup answered no month"
    assert found["billing_rollup_months_folded"][0] > 0, "no month after the fold"
    assert found["billing_rollup"][0] > 0, "no billing line: the digest would prove nothing"
    assert found["billing_rollup"] == found["billing_rows"]
    assert found["billing_rollup_folded"] == found["billing_rows_folded"] == found["billing_rows"]
    stored, folded = found["usage_store_stored"][0], found["usage_store_stored_folded"][0]
    assert folded == 3 * stored  # two new copies kept (the re-delivered insert dropped)
