"""``prism-pipeline query`` is read-only unless ``--allow-writes``, on a real chDB ledger.

The CLI runs in its own process per command (one chDB engine path per process), the way a
user inspects a ledger. The second layer, ClickHouse's ``readonly`` setting, is also run
alone in this process to show it holds even for a statement the check let through.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from prism.sinks import LedgerQueryError, migrate, read_only_query
from prism.sinks import _readonly as readonly_module

pytestmark = pytest.mark.integration

FORGED = (
    "INSERT INTO usage_store (event_id, run_id, seq, scope, tenant_id, cost, currency, "
    "recorded_at) VALUES ('forged', 'r-x', 1, 'provider_turn', 'acme', 1000000, 'USD', now())"
)


def _cli(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "prism.pipeline.cli", "query", "--clickhouse", dsn,
         "--format", "csv", *args],
        capture_output=True, text=True, timeout=120, check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("PRISM_")},
    )  # fmt: skip


def _rows(result: subprocess.CompletedProcess[str]) -> list[str]:
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()[1:]


def test_query_refuses_drop_and_insert_unless_allowed(tmp_path: Path) -> None:
    dsn = f"chdb://{tmp_path}/ledger"
    migrated = subprocess.run(
        [sys.executable, "-m", "prism.pipeline.cli", "migrate", "--clickhouse", dsn],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert migrated.returncode == 0, migrated.stderr

    for statement in ("DROP TABLE runs_store", FORGED, "TRUNCATE TABLE usage_store"):
        refused = _cli(dsn, statement)
        assert refused.returncode == 2, refused.stdout
        assert "refused" in refused.stderr and "--allow-writes" in refused.stderr
        assert "Traceback" not in refused.stderr

    leak = _cli(dsn, "SELECT * FROM file('/etc/hostname', 'LineAsString')")
    assert leak.returncode == 2 and "calls file()" in leak.stderr

    # Reads work, and nothing above changed the ledger.
    assert _rows(_cli(dsn, "EXISTS TABLE runs_store")) == ["1"]
    assert _rows(_cli(dsn, "SELECT count() FROM usage")) == ["0"]

    # An operator can, explicitly.
    assert _cli(dsn, "--allow-writes", FORGED).returncode == 0
    assert _rows(_cli(dsn, "SELECT event_id, cost FROM usage")) == ["forged,1000000.000000000000"]
    assert _cli(dsn, "--allow-writes", "DROP TABLE usage_store").returncode == 0
    assert _rows(_cli(dsn, "EXISTS TABLE usage_store")) == ["0"]


def test_readonly_setting_refuses_what_the_check_lets_through(
    ch_client: Any, ch_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    migrate(ch_client, ch_database)
    monkeypatch.setattr(readonly_module, "check_read_only", lambda sql: None)
    insert = FORGED.replace("usage_store", f"{ch_database}.usage_store")
    with pytest.raises(LedgerQueryError, match="readonly"):
        read_only_query(ch_client, insert)
    with pytest.raises(LedgerQueryError, match="readonly"):
        read_only_query(ch_client, "SELECT * FROM file('/etc/hostname', 'LineAsString')")
    [(n,)] = read_only_query(ch_client, f"SELECT count() FROM {ch_database}.usage").rows
    assert n == 0
    # The refused statements ran on a handle of their own: this client still writes.
    ch_client.command(insert)
    assert read_only_query(ch_client, f"SELECT count() FROM {ch_database}.usage").rows == [(1,)]
