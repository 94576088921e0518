"""``billing`` and ``invoice`` on a fleet that ends now, as the demo's does.

The README's examples used to name fixed dates and print no line, without a word, on the
demo's ledger. Now a period left out is the ledger's own, relative periods (``-7d``,
``now``, ``--month this``) work, and a filter that matches nothing says so on stderr (one
line, exit 0), naming the nearest tenant ids for a tenant the ledger does not know.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from prism.pipeline._store import LedgerStore
from prism.pipeline.cli import main
from prism.pipeline.ingest import ingest_lines
from prism.runtime.simulator import FleetConfig, simulate
from prism.sinks import LedgerWriter, migrate

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def ledger(ch_client: Any, chdb_path: Path) -> Iterator[list[str]]:
    database = f"t_period_{uuid.uuid4().hex[:10]}"
    ch_client.command(f"CREATE DATABASE {database}")
    try:
        migrate(ch_client, database)
        fleet = simulate(FleetConfig(runs=60, seed=11, clock="wall"))
        ingest_lines(
            (r.value for r in fleet.records),
            source="file:fleet.jsonl",
            store=LedgerStore(LedgerWriter(ch_client, database)),
        )
        yield ["--clickhouse", f"chdb://{chdb_path}", "--database", database]
    finally:
        ch_client.command(f"DROP DATABASE IF EXISTS {database} SYNC")


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> list[dict[str, Any]]:
    code, out, err = _cli(capsys, *argv, "--format", "json")
    assert code == 0, err
    assert err == "", err
    rows: list[dict[str, Any]] = json.loads(out)
    return rows


def test_billing_without_a_period_reports_everything_the_ledger_holds(
    ledger: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    everything = _json(capsys, "billing", "--from", "2000-01-01", "--to", "2100-01-01", *ledger)
    assert everything
    assert _json(capsys, "billing", *ledger) == everything
    # The fleet ends now, so the last seven days hold all of it.
    assert _json(capsys, "billing", "--from", "-7d", "--to", "now", *ledger) == everything
    assert _json(capsys, "billing", "--from=-7d", *ledger) == everything


def test_invoice_defaults_to_the_ledgers_latest_month(
    ledger: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _cli(capsys, "invoice", "--format", "csv", *ledger)
    assert code == 0, err
    lines = out.splitlines()[1:]
    assert lines and err.startswith("reconciled ")
    month = lines[-1].split(",")[1]
    code, again, _ = _cli(capsys, "invoice", "--month", month, "--format", "csv", *ledger)
    assert code == 0 and again == out


def test_a_period_off_the_data_says_so_on_stderr(
    ledger: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _cli(capsys, "billing", "--from", "2020-01-01", "--to", "2020-02-01", *ledger)
    assert code == 0
    assert "(0 rows)" in out
    assert len(err.splitlines()) == 1
    assert err.startswith(
        "prism-pipeline billing: no billable usage from 2020-01-01 to 2020-02-01; the "
        "ledger's billable usage runs from "
    )
    # A bound given past the ledger's data, the other left to the ledger: nothing, said so.
    code, out, err = _cli(capsys, "billing", "--from", "now", "--totals", *ledger)
    assert code == 0 and "(0 rows)" in out and len(err.splitlines()) == 1
    assert err.startswith("prism-pipeline billing: no billable usage from "), err
    code, out, err = _cli(capsys, "invoice", "--month", "2020-01", *ledger)
    assert code == 0 and len(err.splitlines()) == 1
    assert err.startswith("prism-pipeline invoice: no billable usage in 2020-01; the ledger's")


def test_an_unknown_tenant_names_the_nearest_tenant_ids(
    ledger: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    tenants = sorted({row["tenant_id"] for row in _json(capsys, "billing", *ledger)})
    real = tenants[0]
    typo = real[:-1] + ("x" if real[-1] != "x" else "y")
    for command in ("billing", "invoice"):
        code, _, err = _cli(capsys, command, "--tenant", typo, *ledger)
        assert code == 0
        said, _, nearest = err.strip().partition("; nearest: ")
        assert (
            said == f"prism-pipeline {command}: no billable usage for tenant {typo!r} in the ledger"
        )
        assert real in nearest.split(", ") and len(err.splitlines()) == 1, err
