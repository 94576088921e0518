"""``billing``, ``invoice``, ``prices`` and ``query`` as a user runs them, on a simulated fleet.

The fleet starts late on 30 November, so its usage falls in two months. It goes through
the file replayer into a chDB ledger; the commands run in-process (``cli.main``) on the
same engine path, and every figure is compared with the simulator's manifest.
"""

from __future__ import annotations

import csv
import io
import json
import uuid
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from prism.pipeline._store import LedgerStore
from prism.pipeline.cli import main
from prism.pipeline.ingest import ingest_lines
from prism.runtime.simulator import Fleet, FleetConfig, simulate
from prism.sinks import LedgerWriter, migrate

pytestmark = pytest.mark.integration

FLEET = FleetConfig(
    runs=80, seed=23, start=datetime(2026, 11, 30, 22, 30, tzinfo=UTC), duplicates=0.03,
    reorder_window=3, post_terminal=0.03, conflicting_terminals=0.02,
)  # fmt: skip
FIGURES = ("rows", "input_tokens", "output_tokens", "total_tokens")


@pytest.fixture(scope="module")
def fleet_ledger(ch_client: Any, chdb_path: Path) -> Iterator[tuple[list[str], Fleet]]:
    database = f"t_bill_{uuid.uuid4().hex[:10]}"
    ch_client.command(f"CREATE DATABASE {database}")
    try:
        migrate(ch_client, database)
        fleet = simulate(FLEET)
        ingest_lines(
            (r.value for r in fleet.records),
            source="file:fleet.jsonl",
            store=LedgerStore(LedgerWriter(ch_client, database)),
        )
        yield ["--clickhouse", f"chdb://{chdb_path}", "--database", database], fleet
    finally:
        ch_client.command(f"DROP DATABASE IF EXISTS {database} SYNC")


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_billing_by_agent_and_month_equals_the_manifest(
    fleet_ledger: tuple[list[str], Fleet], capsys: pytest.CaptureFixture[str]
) -> None:
    conn, fleet = fleet_ledger
    code, out, err = _cli(capsys, "billing", "--from", "2026-11-01", "--to", "2027-01-01",
                          "--group-by", "agent,month", "--format", "json", *conn)  # fmt: skip
    assert code == 0, err
    got: dict[tuple[Any, ...], Any] = defaultdict(int)
    for line in json.loads(out):
        assert list(line)[:2] == ["agent_id", "month"]
        if line["kind"] != "reported":
            assert (line["priced_by"], line["cost"]) == ("unpriced", None)
            continue
        key = (line["agent_id"], line["month"], line["currency"])
        for name in FIGURES:
            got[(*key, name)] += line[name] or 0
        if line["cost"] is not None:
            assert line["priced_by"] == "runtime"
            got[(*key, "cost")] += Decimal(line["cost"])
    want = {
        (g["agent_id"], g["month"], g["currency"], name): g[name]
        if name != "cost"
        else Decimal(g["cost"])
        for g in fleet.manifest["by_agent_month"]
        for name in (*FIGURES, "cost")
    }
    assert {k[1] for k in want} == {"2026-11", "2026-12"}, "the fleet spans two months"
    assert len({k[0] for k in want}) >= 3
    assert dict(got) == want


def test_invoice_lines_per_month_add_up_to_the_manifest(
    fleet_ledger: tuple[list[str], Fleet], capsys: pytest.CaptureFixture[str]
) -> None:
    conn, fleet = fleet_ledger
    events: dict[str, int] = defaultdict(int)
    costs: dict[tuple[str, str], Decimal] = defaultdict(Decimal)
    per_month: dict[str, int] = defaultdict(int)
    for month in ("2026-11", "2026-12"):
        code, out, err = _cli(capsys, "invoice", "--month", month, "--format", "csv", *conn)
        assert code == 0, err
        assert "reconciled" in err
        for row in csv.DictReader(io.StringIO(out)):
            assert row["month"] == month and row["priced_by"] == "runtime"
            events[row["tenant_id"]] += int(row["event_count"])
            per_month[month] += int(row["event_count"])
            costs[(row["tenant_id"], row["currency"])] += Decimal(row["cost"])
    tenants = fleet.manifest["tenants"]
    billed = {t: v["billable"] for t, v in tenants.items() if v["billable"]["rows"]}
    assert dict(events) == {t: v["rows"] for t, v in billed.items()}
    assert dict(costs) == {
        (t, c): Decimal(v) for t, fig in tenants.items() for c, v in fig["billable"]["cost"].items()
    }
    months: dict[str, int] = defaultdict(int)
    for g in fleet.manifest["by_agent_month"]:
        months[g["month"]] += g["rows"]
    assert dict(per_month) == dict(months)


def test_the_table_is_for_people_and_parquet_is_exact(
    fleet_ledger: tuple[list[str], Fleet], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import pyarrow.parquet as pq

    conn, _ = fleet_ledger
    period = ("--from", "2026-11-01", "--to", "2027-01-01", "--group-by", "tenant")
    code, table, err = _cli(capsys, "billing", *period, *conn)
    assert code == 0, err
    lines, totals = table.split("\n\nTotals per currency\n")
    header = lines.splitlines()[0].split()
    assert header[:5] == ["tenant_id", "kind", "currency", "confidence", "priced_by"]
    reported = [r.split() for r in lines.splitlines()[2:-1] if " reported " in r]
    cost = reported[0][header.index("cost")]
    assert len(cost.rpartition(".")[2]) == 6, cost
    assert any("," in r[header.index("input_tokens")] for r in reported), "thousands separators"
    assert totals.splitlines()[0].split()[:3] == ["kind", "currency", "rows"]

    out = tmp_path / "bill.parquet"
    code, _, err = _cli(capsys, "billing", *period, "--format", "parquet", "--out", str(out), *conn)
    assert code == 0 and "to " + str(out) in err
    parquet = pq.read_table(out)
    assert str(parquet.schema.field("cost").type) == "decimal128(38, 12)"
    code, text, _ = _cli(capsys, "billing", *period, "--format", "json", *conn)
    exact = [Decimal(r["cost"]) if r["cost"] else None for r in json.loads(text)]
    assert parquet.column("cost").to_pylist() == exact
    assert _cli(capsys, "billing", *period, "--format", "parquet", *conn)[0] == 2


def test_prices_load_and_list(
    fleet_ledger: tuple[list[str], Fleet], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    conn, _ = fleet_ledger
    path = tmp_path / "prices.csv"
    path.write_text("provider,model,token_kind,unit_price,currency,valid_from\n"
                    "acme-ai,m1,input,1.5,USD,2026-11-01\n", encoding="utf-8")  # fmt: skip
    assert _cli(capsys, "prices", "load", str(path), *conn)[1].endswith(
        "1 new, 0 changed, 0 unchanged price(s) in " + conn[-1] + ".prices\n"
    )
    assert "0 new, 0 changed, 1 unchanged" in _cli(capsys, "prices", "load", str(path), *conn)[1]
    code, out, _ = _cli(capsys, "prices", "list", "--format", "csv", *conn)
    assert out.splitlines()[1].split(",") == [
        "acme-ai", "m1", "input", "USD", "2026-11-01T00:00:00+00:00", "1.500000000000", "1000000"
    ]  # fmt: skip
    path.write_text("provider,model,token_kind,unit_price,currency,valid_from\n"
                    "acme-ai,m1,inptu,1.5,USD,2026-11-01\n", encoding="utf-8")  # fmt: skip
    code, _, err = _cli(capsys, "prices", "load", str(path), *conn)
    assert code == 2 and f"{path}:2: token_kind 'inptu'" in err


def test_query_vertical_with_parameters(
    fleet_ledger: tuple[list[str], Fleet], capsys: pytest.CaptureFixture[str]
) -> None:
    conn, fleet = fleet_ledger
    tenant = sorted(fleet.manifest["tenants"])[0]
    runs = sum(1 for r in fleet.manifest["runs"].values() if r["tenant_id"] == tenant)
    sql = (
        "SELECT tenant_id, count() AS runs FROM runs "
        "WHERE tenant_id = {tenant:String} AND model_turns >= {turns:UInt32} GROUP BY tenant_id"
    )
    code, out, err = _cli(capsys, "query", sql, "--param", f"tenant={tenant}",
                          "--param", "turns=0", "--format", "vertical", *conn)  # fmt: skip
    assert code == 0, err
    assert out.splitlines() == [
        "Row 1:", "------", f"tenant_id: {tenant}", f"     runs: {runs}", "", "(1 row)",
    ]  # fmt: skip
    code, _, err = _cli(capsys, "query", sql, "--param", "tenant=x", *conn)
    assert code == 1 and "turns" in err
    with pytest.raises(SystemExit):
        main(["query", sql, "--param", "no-equals-sign", *conn])
    assert "is not NAME=VALUE" in capsys.readouterr().err
