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
