"""The billing report on a simulated fleet (chaos included) equals the simulator's manifest.

The fleet goes through the file replayer (the same core as the worker) into the ledger;
the manifest is the simulator's independent account of what must be billed.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from prism.pipeline._store import LedgerStore
from prism.pipeline.ingest import ingest_lines
from prism.runtime.simulator import FleetConfig, simulate
from prism.sinks import LedgerWriter, billing_report, migrate

pytestmark = pytest.mark.integration

TOKENS = (
    "input_tokens",
    "output_tokens",
    "total_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
)


def _from_report(lines: list[Any]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"rows": 0, "cost": defaultdict(Decimal), "estimated_rows": 0,
                 "by_confidence": defaultdict(int), **dict.fromkeys(TOKENS, 0)}
    )  # fmt: skip
    for line in lines:
        t = out[line.tenant_id]
        if line.kind == "reported":
            t["rows"] += line.rows
            for name in TOKENS:
                t[name] += getattr(line, name) or 0
            if line.cost is not None:
                t["cost"][line.currency] += line.cost
        else:
            t["estimated_rows"] += line.rows
            t["by_confidence"][line.confidence or "low"] += line.total_tokens or 0
    return out


@pytest.mark.timeout(300)
def test_billing_on_a_simulated_fleet_equals_the_manifest(ch_client: Any, ch_database: str) -> None:
    fleet = simulate(
        FleetConfig(runs=400, seed=5, duplicates=0.03, reorder_window=3, post_terminal=0.02,
                    conflicting_terminals=0.02, malformed=0.01)
    )  # fmt: skip
    migrate(ch_client, ch_database)
    writer = LedgerWriter(ch_client, ch_database)
    ingest_lines((r.value for r in fleet.records), source="file:fleet", store=LedgerStore(writer),
                 batch_size=500)  # fmt: skip
    lines = billing_report(
        ch_client, ch_database, datetime(2000, 1, 1, tzinfo=UTC), datetime(2100, 1, 1, tzinfo=UTC)
    )
    got = _from_report(lines)
    expected = fleet.manifest["tenants"]
    # the fleet exercises what billing must get right: estimates, currencies, run totals
    assert sum(t["estimated_rows"] for t in got.values()) > 0
    assert len({c for t in got.values() for c in t["cost"]}) >= 2
    totals = ch_client.query(
        f"SELECT count() FROM {ch_database}.usage WHERE scope = 'run_total'"
    ).result_rows[0][0]
    assert totals > 0
    billed = [t for t, v in expected.items() if v["billable"]["rows"] or v["estimated"]["rows"]]
    assert sorted(got) == sorted(billed)
    for tenant in billed:
        want, have = expected[tenant], got[tenant]
        bill = want["billable"]
        assert have["rows"] == bill["rows"], tenant
        for name in TOKENS:
            assert have[name] == bill[name], (tenant, name)
        assert {c: v for c, v in have["cost"].items()} == {
            c: Decimal(v) for c, v in bill["cost"].items()
        }, tenant
        est = want["estimated"]
        assert have["estimated_rows"] == est["rows"], tenant
        confidences = {k: v for k, v in est["by_confidence"].items() if v}
        assert {k: v for k, v in have["by_confidence"].items() if v} == confidences, tenant
