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
