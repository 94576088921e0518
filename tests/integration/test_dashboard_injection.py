"""Hostile dashboard variable values cannot break out of the SQL, nor show another tenant.

A chDB ledger holds two tenants' runs (a simulated fleet cut to two tenants, the second
one's id itself hostile). For every panel and variable query of every dashboard, each
value a viewer could send (``\\'``, ``'``, ``\\``, ``--``, ``;``, Unicode, a UNION, the
other tenant's run id) is expanded through the project's macro expander, as Grafana and
the plugin would, and run:

- no statement fails;
- with tenant ``T`` selected, every panel returns exactly what it returns on a copy of the
  ledger that holds only ``T``'s rows (dead letters, which have no tenant, in both);
- a value that names no tenant returns what a ledger without tenant rows returns;
- a hostile run id behaves as a run id that does not exist.
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import Any

import orjson
import pytest

from prism.dashboards import (
    ALL,
    DASHBOARDS,
    TimeRange,
    Variable,
    dashboard_json,
    expand_query,
    lint_dashboard,
)
from prism.pipeline._store import LedgerStore
from prism.pipeline.ingest import ingest_lines
from prism.runtime.simulator import FleetConfig, simulate
from prism.sinks import STORAGE_TABLES, LedgerWriter, migrate

pytestmark = pytest.mark.integration

FLEET = FleetConfig(runs=160, seed=5, duplicates=0.02, reorder_window=2, malformed=0.03)
HOSTILE_TENANT = "t2\\' OR 1=1 -- ;ü"
HOSTILE = [
    "\\'",
    "'",
    "\\",
    "--",
    ";",
    "ünïcødé ✓",
    "\\' OR 1=1 -- ",
    "' OR '1'='1",
    "x') OR 1=1 --",
    "\\' UNION ALL SELECT name FROM system.tables -- ",
    "%27",
    "{acme}",
    "a,b",
]
FIXED_NOW = "toDateTime64('2031-01-01 00:00:00', 3)"


@dataclass
class Ledgers:
    client: Any
    full: str  # both tenants
    only: dict[str, str]  # tenant -> database holding only its rows
    empty: str  # no tenant's rows (dead letters only)
    tenants: tuple[str, str]
    run_id: str  # a run of the first tenant with events, turns and tool calls
    time_range: TimeRange


def _two_tenant_lines() -> tuple[list[bytes], tuple[str, str], Any]:
    fleet = simulate(FLEET)
    first, second = sorted(fleet.manifest["tenants"])[:2]
    lines = []
    for record in fleet.records:
        try:
            envelope = orjson.loads(record.value)
        except orjson.JSONDecodeError:
            lines.append(record.value)  # junk: a dead letter
            continue
        tenant = envelope.get("tenantId") if isinstance(envelope, dict) else None
        if tenant not in (first, second, None):
            continue
        if tenant == second:
            envelope["tenantId"] = HOSTILE_TENANT
        lines.append(orjson.dumps(envelope))
    return lines, (first, HOSTILE_TENANT), fleet


@pytest.fixture(scope="module")
def ledgers(ch_client: Any) -> Iterator[Ledgers]:
    tag = uuid.uuid4().hex[:8]
    names = {"full": f"t_inj_{tag}", "a": f"t_inj_{tag}_a", "b": f"t_inj_{tag}_b",
             "none": f"t_inj_{tag}_none"}  # fmt: skip
    lines, tenants, _fleet = _two_tenant_lines()
    start = FLEET.resolved_start
    try:
        for db in names.values():
            ch_client.command(f"CREATE DATABASE {db}")
            migrate(ch_client, db, raw_event_ttl_days=3650)
        ingest_lines(
            lines,
            source="file:two-tenants.jsonl",
            store=LedgerStore(LedgerWriter(ch_client, names["full"])),
            clock=lambda: (start + timedelta(hours=3)).timestamp(),
        )
        for key, tenant in (("a", tenants[0]), ("b", tenants[1]), ("none", None)):
            for table, row in STORAGE_TABLES.values():
                has_tenant = "tenant_id" in {f.name for f in row.__dataclass_fields__.values()}
                where = "tenant_id = {t:String}" if has_tenant and tenant else "1"
                if has_tenant and tenant is None:
                    where = "0"
                ch_client.command(
                    f"INSERT INTO {names[key]}.{table} SELECT * FROM {names['full']}.{table} "
                    f"WHERE {where}",
                    parameters={"t": tenant or ""},
                )
        [(run_id,)] = ch_client.query(
            f"SELECT run_id FROM {names['full']}.runs WHERE tenant_id = {{t:String}} "
            "AND tool_calls > 0 AND model_turns > 0 ORDER BY run_id LIMIT 1",
            parameters={"t": tenants[0]},
        ).result_rows
        yield Ledgers(
            client=ch_client,
            full=names["full"],
            only={tenants[0]: names["a"], tenants[1]: names["b"]},
            empty=names["none"],
            tenants=tenants,
            run_id=run_id,
            time_range=TimeRange(
                start - timedelta(minutes=30), start + timedelta(hours=4), timedelta(minutes=5)
            ),
        )
    finally:
        for db in names.values():
            ch_client.command(f"DROP DATABASE IF EXISTS {db} SYNC")


def _queries(dash: dict[str, Any]) -> list[tuple[str, str]]:
    out = [(f"variable {v['name']}", v["query"]) for v in dash["templating"]["list"]
           if v["type"] == "query"]  # fmt: skip
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            out.append((f"{panel['title']}/{target['refId']}", target["rawSql"]))
    return out


def _normal(rows: list[tuple[Any, ...]]) -> list[str]:
    """Rows comparable across databases: floats rounded (summation order), sorted."""

    def value(v: Any) -> Any:
        if isinstance(v, float):
            return "nan" if math.isnan(v) else round(v, 6)
        if isinstance(v, Decimal):
            return str(v)
        if isinstance(v, (list, tuple)):
            return [value(x) for x in v]
        return v

    return sorted(repr([value(v) for v in row]) for row in rows)


def _run(ledgers: Ledgers, sql: str, where: str) -> list[str]:
    sql = re.sub(r"now64\(3\)|now\(\)", FIXED_NOW, sql)
    try:
        return _normal(list(ledgers.client.query(sql).result_rows))
    except Exception as exc:  # a statement error is a finding: show the SQL
        pytest.fail(f"{where}: the expanded query failed: {exc}\n{sql}")


def _variables(tenant: str | list[str], run_id: str) -> list[Variable]:
    value = tenant if isinstance(tenant, list) else [tenant]
    return [
        Variable("datasource", "prism-clickhouse"),
        Variable("tenant", value, options=()),
        Variable("run_id", run_id),
    ]


def _results(ledgers: Ledgers, build: Any, db: str, tenant: Any, run_id: str) -> dict[str, Any]:
    dash = dashboard_json(build(db))
    assert lint_dashboard(dash) == []
    tr, variables = ledgers.time_range, _variables(tenant, run_id)
    # Every other filter (agent, user, session, provider, tool) on All, as a board opens.
    variables += [
        Variable(v["name"], [ALL], options=())
        for v in dash["templating"]["list"]
        if v["type"] == "query" and v["name"] not in ("tenant", "run_id")
    ]
    return {
        where: _run(ledgers, expand_query(sql, tr, variables), f"{dash['uid']}/{where}")
        for where, sql in _queries(dash)
        if where != "variable tenant"  # the list of tenants to pick from: checked below
    }


def _same(got: dict[str, Any], want: dict[str, Any], case: str) -> None:
    different = [where for where in want if got[where] != want[where]]
    assert not different, f"{case}: these queries returned other rows: {different}"


@pytest.mark.parametrize("build", DASHBOARDS, ids=[b.__name__ for b in DASHBOARDS])
def test_a_selected_tenant_sees_only_its_rows(ledgers: Ledgers, build: Any) -> None:
    for tenant in ledgers.tenants:
        got = _results(ledgers, build, ledgers.full, tenant, ledgers.run_id)
        want = _results(ledgers, build, ledgers.only[tenant], tenant, ledgers.run_id)
        _same(got, want, f"tenant={tenant!r}")
        assert any(got.values()), "the tenant's dashboards show nothing: a vacuous test"


# Each alone (a single value is interpolated without braces), then all of them at once.
HOSTILE_SELECTIONS: list[Any] = [
    "\\' OR 1=1 -- ", "'", "\\", "ünïcødé ✓", "{acme}", [*HOSTILE, "never-a-tenant"],
]  # fmt: skip


@pytest.mark.parametrize("build", DASHBOARDS, ids=[b.__name__ for b in DASHBOARDS])
def test_hostile_tenant_values_select_nothing_and_break_nothing(
    ledgers: Ledgers, build: Any
) -> None:
    want = _results(ledgers, build, ledgers.empty, "never-a-tenant", ledgers.run_id)
    for value in HOSTILE_SELECTIONS:
        got = _results(ledgers, build, ledgers.full, value, ledgers.run_id)
        _same(got, want, f"tenant={value!r}")


@pytest.mark.parametrize("build", DASHBOARDS, ids=[b.__name__ for b in DASHBOARDS])
def test_hostile_run_ids_are_just_unknown_runs(ledgers: Ledgers, build: Any) -> None:
    want = _results(ledgers, build, ledgers.full, [ALL], "no-such-run")
    for value in ("\\' OR 1=1 -- ", "' OR '1'='1", "\\", "x') OR 1=1 --", "ü;--"):
        _same(_results(ledgers, build, ledgers.full, [ALL], value), want, f"run_id={value!r}")


def test_the_run_explorer_shows_a_run_only_to_its_tenant(ledgers: Ledgers) -> None:
    from prism.dashboards import run_explorer

    dash = dashboard_json(run_explorer(ledgers.full))
    tr = ledgers.time_range
    timeline = next(p for p in dash["panels"] if p.get("title") == "Timeline")
    sql = timeline["targets"][0]["rawSql"]
    own, other = ledgers.tenants
    assert ledgers.client.query(expand_query(sql, tr, _variables(own, ledgers.run_id))).result_rows
    assert not ledgers.client.query(
        expand_query(sql, tr, _variables(other, ledgers.run_id))
    ).result_rows
    options = next(v for v in dash["templating"]["list"] if v["name"] == "tenant")["query"]
    listed = {r[0] for r in ledgers.client.query(expand_query(options, tr, [])).result_rows}
    assert listed == set(ledgers.tenants)
