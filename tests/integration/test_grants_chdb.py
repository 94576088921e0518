"""The grants DDL against the chDB engine: what chDB can check of it, checked.

chDB (clickhouse-local) has no writable access storage: CREATE USER, CREATE ROLE,
CREATE ROW POLICY and CREATE SETTINGS PROFILE fail (ACCESS_DENIED, or "no writeable access
storage" even with access management enabled through a config file). So this file checks
what it can: every statement parses with ClickHouse's own parser (``formatQuery``), and
each row policy's condition, evaluated on a two-tenant ledger with the tenant setting
replaced by its value, keeps exactly the selected tenant's rows.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from prism.schemas import LedgerBatch, ProgressRow
from prism.sinks import (
    STORAGE_TABLES,
    TENANT_SETTING,
    LedgerWriter,
    SourceRange,
    grants_sql,
    migrate,
    sql_string,
)
from prism.sinks._tables import columns_of
from prism.sinks.testing import (
    T0,
    alert_row,
    channel_rows,
    dead_letter_row,
    event_row,
    quarantine_row,
    run_row,
    turn_row,
    usage_row,
)

pytestmark = pytest.mark.integration

HOSTILE = "evil\\' OR 1=1 -- ; ünï"
TENANTS = ("acme", HOSTILE)


def _batch(tenant: str, tag: str) -> LedgerBatch:
    t = {"tenant_id": tenant}
    return LedgerBatch(
        runs=[run_row(f"r{tag}", **t)],
        turns=[turn_row(f"r{tag}", **t)],
        usage=[usage_row(f"u{tag}", f"r{tag}", **t)],
        events=[event_row(f"e{tag}", f"r{tag}", **t)],
        quarantine=[quarantine_row(f"q{tag}", f"r{tag}", **t)],
        dead_letters=[dead_letter_row(int(tag))],
        alerts=[alert_row(f"a{tag}", **t)],
        **channel_rows(f"op{tag}", f"c{tag}", **t),
        progress=[ProgressRow(T0, f"w{tag}", "prism.agent-events", int(tag), 5, 9, 4, None)],
    )


@pytest.mark.parametrize("cluster", [None, "main"])
def test_every_statement_parses_with_clickhouse(ch_client: Any, cluster: str | None) -> None:
    for statement in grants_sql("prism", cluster=cluster, tenants=TENANTS):
        formatted = ch_client.query(
            "SELECT formatQuery({q:String})", parameters={"q": statement}
        ).result_rows[0][0]
        assert formatted.split()[0] == statement.split()[0], statement


def test_chdb_cannot_create_accounts(ch_client: Any) -> None:
    """Documents why the DDL is not executed here (see the module docstring)."""
    with pytest.raises(Exception, match=r"ACCESS_DENIED|Not enough privileges|access storage"):
        ch_client.command("CREATE ROLE IF NOT EXISTS prism_probe_role")


def test_row_policy_conditions_keep_only_the_selected_tenant(
    ch_client: Any, ch_database: str
) -> None:
    migrate(ch_client, ch_database)
    writer = LedgerWriter(ch_client, ch_database)
    for i, tenant in enumerate(TENANTS, 1):
        writer.add(_batch(tenant, str(i)), SourceRange("t", 0, i, i))
    writer.flush()
    policies = {
        m[1]: m[2]
        for s in grants_sql(ch_database)
        if (m := re.match(rf"CREATE ROW POLICY OR REPLACE prism_tenant ON {ch_database}\.(\w+) "
                          r"FOR SELECT USING (.+) AS PERMISSIVE", s))
    }  # fmt: skip
    assert set(policies) == {table for table, _ in STORAGE_TABLES.values()}
    rows_of = {table: row for table, row in STORAGE_TABLES.values()}
    for table, condition in policies.items():
        for selected in (*TENANTS, "*", "nobody"):
            sql = condition.replace(f"getSetting('{TENANT_SETTING}')", sql_string(selected))
            has_tenant = "tenant_id" in columns_of(rows_of[table])
            column = "tenant_id" if has_tenant else "'-'"
            rows = ch_client.query(
                f"SELECT DISTINCT {column} FROM {ch_database}.{table} WHERE {sql}"
            ).result_rows
            seen = {r[0] for r in rows}
            if table == "channel_watermark_store":  # one pipeline-wide row, for every tenant
                assert seen == {"-"}, (table, selected)
            elif selected == "*":
                assert seen == (set(TENANTS) if has_tenant else {"-"}), (table, selected)
            elif selected in TENANTS and has_tenant:
                assert seen == {selected}, (table, selected)
            else:
                assert seen == set(), (table, selected)
