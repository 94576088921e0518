"""``prism-pipeline migrate``, ``query`` and ``billing`` as a user runs them (own processes).

chDB allows one engine path per process, so each command runs in a subprocess on a ledger
path of its own, the way a user inspects a ledger no worker is holding.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from prism.sinks import load_migrations

pytestmark = pytest.mark.integration

WRITE_ROWS = """
import sys
from datetime import UTC, datetime
from decimal import Decimal
from prism.schemas import LedgerBatch
from prism.sinks import LedgerWriter, SourceRange, connect
from prism.sinks.testing import usage_row
client = connect(sys.argv[1], "prism")
writer = LedgerWriter(client, "prism")
at = datetime(2025, 1, 10, tzinfo=UTC)
writer.add(LedgerBatch(usage=[
    usage_row("u1", "r1", recorded_at=at, input_tokens=100, cost=Decimal("0.5"), currency="EUR"),
    usage_row("u2", "r1", recorded_at=at, scope="run_total", turn=None, attempt=None),
]), SourceRange("file:test", -1, 1, 2))
writer.flush()
"""


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "prism.pipeline.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_migrate_query_and_billing_commands(tmp_path: Path) -> None:
    dsn = f"chdb://{tmp_path}/ledger"
    env = {**os.environ, "PRISM_CLICKHOUSE_DSN": dsn, "PRISM_CLICKHOUSE_DATABASE": "prism"}

    first = _cli("migrate", env=env)
    assert first.returncode == 0, first.stderr
    shipped = ", ".join(f"{m.version:04d}_{m.name}" for m in load_migrations())
    assert first.stdout.strip() == f"prism: applied {shipped}"
    again = _cli("migrate", "--clickhouse", dsn, env=env)
    assert again.stdout.strip() == "prism: up to date"

    wrote = subprocess.run([sys.executable, "-c", WRITE_ROWS, dsn], capture_output=True,
                           text=True, env=env, timeout=120, check=False)  # fmt: skip
    assert wrote.returncode == 0, wrote.stderr

    counted = _cli("query", "SELECT scope, count() AS n FROM usage GROUP BY scope ORDER BY scope",
                   "--format", "csv", env=env)  # fmt: skip
    assert counted.returncode == 0, counted.stderr
    assert counted.stdout.splitlines() == ["scope,n", "provider_turn,1", "run_total,1"]

    billed = _cli("billing", "--from", "2025-01-01", "--to", "2025-02-01", "--format", "json",
                  env=env)  # fmt: skip
    assert billed.returncode == 0, billed.stderr
    (line,) = json.loads(billed.stdout)
    assert (line["tenant_id"], line["kind"], line["currency"]) == ("acme", "reported", "EUR")
    assert (line["rows"], line["input_tokens"], line["cost"]) == (1, 100, "0.500000000000")

    bad = _cli("query", "SELECT no_such_column FROM runs", env=env)
    assert bad.returncode == 1
    assert "no_such_column" in bad.stderr and "Traceback" not in bad.stderr
