"""The demo's ground-truth check compares every manifest figure and names what disagrees."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from prism.devstack._truth import compare, render, unread_sections
from prism.pipeline._store import LedgerStore
from prism.pipeline.ingest import ingest_lines
from prism.runtime.simulator import FleetConfig, simulate
from prism.sinks import LedgerWriter, migrate

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

FLEET = FleetConfig(
    runs=300,
    seed=7,
    duplicates=0.03,
    reorder_window=3,
    post_terminal=0.02,
    conflicting_terminals=0.01,
    malformed=0.01,
    oversized=0.005,
    guardrail_denials=0.05,
    limit_death_burst=8,
)


def test_a_faithful_ledger_passes_every_check_and_a_tampered_one_is_named(
    ch_client: Any, ch_database: str
) -> None:
    migrate(ch_client, ch_database, raw_event_ttl_days=3650)
    fleet = simulate(FLEET)
    clock = fleet.manifest["params"]["processing_clock"].replace("Z", "+00:00")
    processing_clock = datetime.fromisoformat(clock).timestamp()
    ingest_lines(
        (r.value for r in fleet.records),
        source="file:fleet.jsonl",
        store=LedgerStore(LedgerWriter(ch_client, ch_database)),
        clock=lambda: processing_clock,  # the clock the manifest judges event time with
        max_event_bytes=FLEET.max_event_bytes,
    )
    checks = compare(ch_client, ch_database, fleet.manifest, fleet.events)
    by_name = {c.name: c for c in checks}
    assert [c.name for c in checks if not c.ok] == [], render(checks)
    for name in (
        "runs by status",
        "run records",
        "billable usage",
        "reported cost",
        "estimates by confidence",
        "dead letters by reason",
        "quarantine by reason",
        "events applied",
        "quarantined events",
        "guardrail denials",
        "exhaustion alerts",
        "stale-run alerts",
        "billing by agent, month",
    ):
        assert by_name[name].compared > 0, name
    assert by_name["run records"].compared >= 300 * 17
    text = render(checks, unread_sections(fleet.manifest))
    assert "ok       runs by status" in text and "ok       reported cost" in text

    # The ledger loses one run and one dead letter: the checks say which and where.
    run_id = next(iter(fleet.manifest["runs"]))
    ch_client.command(f"DELETE FROM {ch_database}.runs_store WHERE run_id = '{run_id}'")
    ch_client.command(
        f"ALTER TABLE {ch_database}.dead_letters_store UPDATE code = 'oversized' "
        "WHERE code = 'unparsable' SETTINGS mutations_sync = 2"
    )
    failed = {
        c.name: c for c in compare(ch_client, ch_database, fleet.manifest, fleet.events) if not c.ok
    }
    assert set(failed) >= {"runs by status", "run records", "dead letters by reason"}
    # its usage no longer has an agent in billing by agent and month
    assert "billing by agent, month" in failed
    assert f"run {run_id}: missing from the ledger" in failed["run records"].problems
    assert "MISMATCH dead letters by reason" in render(list(failed.values()))

    # An exhaustion alert of the right tenant and axis at another time is a mismatch too
    # (rule 16: the firing time is part of the alert).
    (alert_id,) = [a["alert_id"] for a in fleet.manifest["alerts"]["run_limit_exhaustion"]]
    moved = alert_id[: -len("+00:00")] + "1+00:00"  # one more digit: another microsecond
    firing = ch_client.query(
        f"SELECT * FROM {ch_database}.alerts_store WHERE alert_id = '{alert_id}' "
        "AND state = 'firing'"
    )
    (row,) = [dict(zip(firing.column_names, r, strict=True)) for r in firing.result_rows]
    row["alert_id"] = moved
    ch_client.insert(
        f"{ch_database}.alerts_store",
        [list(row.values())],
        column_names=list(row),
        settings={"async_insert": 0},  # on by default in ClickHouse 26: land before the check
    )
    ch_client.command(
        f"ALTER TABLE {ch_database}.alerts_store DELETE WHERE alert_id = '{alert_id}' "
        "SETTINGS mutations_sync = 2"
    )
    failed = {
        c.name: c for c in compare(ch_client, ch_database, fleet.manifest, fleet.events) if not c.ok
    }
    assert "exhaustion alerts" in failed


def test_sections_the_check_cannot_read_are_listed_not_hidden() -> None:
    manifest = {"runs": {}, "params": {}, "tenants": {}, "dlq": {}, "future_section": {}}
    assert unread_sections(manifest) == ["future_section"]
