"""The ledger keeps each transition of an alert: when it fired and when it resolved."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from prism.schemas import AlertRow, LedgerBatch
from prism.sinks import LedgerWriter, SourceRange, migrate

pytestmark = pytest.mark.integration


def _alert(state: str, version: int, at: datetime) -> AlertRow:
    return AlertRow(
        alert_id="run_limit_exhaustion:acme:maxTurns:2026-11-30T01:00:00+00:00",
        rule="run_limit_exhaustion", state=state, tenant_id="acme", key="maxTurns",
        value=5.0 if state == "firing" else 1.0, threshold=5.0,
        window_start=at - timedelta(minutes=5), window_end=at, ts=at, message=state,
        version=version,
    )  # fmt: skip


def test_firing_and_resolved_rows_both_survive_merges(ch_client: Any, ch_database: str) -> None:
    migrate(ch_client, ch_database)
    t0 = datetime(2026, 11, 30, 1, 0, tzinfo=UTC)
    writer = LedgerWriter(ch_client, ch_database)
    writer.add(LedgerBatch(alerts=[_alert("firing", 1, t0)]), SourceRange("d", 0, 0, 0))
    writer.flush()
    writer.add(LedgerBatch(alerts=[_alert("resolved", 2, t0 + timedelta(minutes=9))]),
               SourceRange("d", 0, 1, 1))  # fmt: skip
    writer.flush()
    writer.add(LedgerBatch(alerts=[_alert("firing", 1, t0)]), SourceRange("d", 0, 0, 0))
    writer.flush()  # a redelivered firing row changes nothing
    ch_client.command(f"OPTIMIZE TABLE {ch_database}.alerts_store FINAL")
    rows = ch_client.query(f"SELECT state, ts FROM {ch_database}.alerts ORDER BY ts").result_rows
    assert [r[0] for r in rows] == ["firing", "resolved"]
