"""The least-privilege accounts' DDL, read as text (the server-side check is in integration)."""

from __future__ import annotations

import re

import pytest

from prism.pipeline.cli import main
from prism.sinks import STORAGE_TABLES, VIEWS, LedgerConfigError, accounts, grants_sql, sql_string

STORES = sorted(table for table, _ in STORAGE_TABLES.values())
_GRANT_RE = re.compile(r"^GRANT (?P<privs>.+?) ON (?P<on>\S+) TO (?P<to>\w+)$")


def _grants(statements: list[str], role: str) -> dict[str, str]:
    """object -> privileges granted to ``role``."""
    out = {}
    for st in statements:
        m = _GRANT_RE.match(st)
        if m and m["to"] == role:
            out[m["on"]] = m["privs"]
    return out


@pytest.fixture(scope="module")
def ddl() -> list[str]:
    return grants_sql("prism", tenants=["acme"])


def test_the_writer_may_only_insert_and_read_its_storage_tables(ddl: list[str]) -> None:
    grants = _grants(ddl, "prism_writer_role")
    assert {k: v for k, v in grants.items() if k.startswith("prism.")} == {
        **{f"prism.{t}": "SELECT, INSERT" for t in STORES},
        "prism.ingest_state": "SELECT, INSERT",
        "prism.schema_migrations": "SELECT",
    }
    assert {k for k in grants if not k.startswith("prism.")} == {
        "system.settings", "system.databases", "system.tables", "system.columns",
    }  # fmt: skip
    assert all(v == "SELECT" for k, v in grants.items() if k.startswith("system."))


def test_the_reader_only_selects(ddl: list[str]) -> None:
    grants = _grants(ddl, "prism_reader_role")
    assert {f"prism.{v}" for v in VIEWS} <= set(grants)
    assert all(p.startswith("SELECT") for p in grants.values())
    assert "readonly = 2 CONST" in next(s for s in ddl if "prism_reader_profile SETTINGS" in s)


def test_the_grafana_reader_sees_views_catalog_and_no_raw_dead_letters(ddl: list[str]) -> None:
    grants = _grants(ddl, "prism_grafana_role")
    assert all(p.startswith("SELECT") for p in grants.values())
    assert {k for k in grants if k.startswith("system.")} == {
        "system.databases", "system.tables", "system.columns",
    }  # fmt: skip
    assert "prism.schema_migrations" not in grants
    dead = grants["prism.dead_letters_store"]
    assert dead.startswith("SELECT(") and "raw" not in dead and "preview" in dead
    profile = next(s for s in ddl if "prism_grafana_profile SETTINGS" in s)
    assert "readonly = 1 CONST" in profile
    assert "max_execution_time = 60 CHANGEABLE_IN_READONLY" in profile
    assert "SQL_prism_tenant = '*' CONST" in profile


def test_every_store_has_a_tenant_policy_and_an_all_rows_policy(ddl: list[str]) -> None:
    for table in STORES:
        tenant = [
            s
            for s in ddl
            if s.startswith(f"CREATE ROW POLICY OR REPLACE prism_tenant ON prism.{table} ")
        ]
        others = [
            s
            for s in ddl
            if s.startswith(f"CREATE ROW POLICY OR REPLACE prism_all_rows ON prism.{table} ")
        ]
        assert len(tenant) == len(others) == 1, table
        assert tenant[0].endswith("AS PERMISSIVE TO prism_grafana_role")
        assert "getSetting('SQL_prism_tenant') = '*'" in tenant[0]
        if table in ("dead_letters_store", "worker_progress_store"):  # no tenant: all-tenant only
            assert "tenant_id" not in tenant[0]
        elif table == "channel_watermark_store":  # one pipeline-wide row, no tenant data
            assert tenant[0].endswith(
                "= '*' OR key = 'pipeline' AS PERMISSIVE TO prism_grafana_role"
            ), tenant[0]
        else:
            assert "tenant_id = getSetting('SQL_prism_tenant')" in tenant[0], table
        assert others[0].endswith("USING 1 AS PERMISSIVE TO ALL EXCEPT prism_grafana_role")


def test_no_role_gets_ddl_or_access_management(ddl: list[str]) -> None:
    for st in ddl:
        m = _GRANT_RE.match(st)
        if m:
            for word in (
                "ALTER",
                "CREATE",
                "DROP",
                "TRUNCATE",
                "ALL",
                "ACCESS",
                "SYSTEM",
                "FILE",
                "URL",
            ):
                assert word not in m["privs"].split(), st  # fmt: skip
    revoke = "REVOKE ALL ON *.* FROM prism_grafana_role, prism_reader_role, prism_writer_role"
    assert ddl.index(revoke) < min(i for i, s in enumerate(ddl) if s.startswith("GRANT"))


def test_logins_use_password_placeholders_unless_given(ddl: list[str]) -> None:
    users = [s for s in ddl if s.startswith("CREATE USER")]
    assert [u.split()[4] for u in users] == [
        "prism_writer", "prism_reader", "prism_grafana", "prism_grafana_acme",
    ]  # fmt: skip
    assert "BY '${CLICKHOUSE_WRITER_PASSWORD}'" in users[0]
    assert "BY '${CLICKHOUSE_GRAFANA_ACME_PASSWORD}'" in users[3]
    assert "SETTINGS PROFILE 'prism_grafana_acme_profile'" in users[3]
    given = grants_sql("prism", password=lambda a: sql_string(f"pw-{a.user}'\\"))
    writer = next(s for s in given if s.startswith("CREATE USER OR REPLACE prism_writer "))
    assert "BY 'pw-prism_writer\\'\\\\' DEFAULT DATABASE prism" in writer
    assert "GRANT prism_writer_role TO prism_writer" in given
    assert "ALTER USER prism_writer DEFAULT ROLE prism_writer_role" in given


def test_hostile_tenants_are_escaped_and_named_safely() -> None:
    hostile = "t' OR 1=1 --\\"
    ddl = grants_sql("prism", tenants=[hostile, "acme", "acme"])
    [account] = [a for a in accounts([hostile]) if a.tenant == hostile]
    assert re.fullmatch(r"prism_grafana_t_or_1_1_[0-9a-f]{8}", account.user)
    assert re.fullmatch(r"CLICKHOUSE_GRAFANA_T_OR_1_1_[0-9A-F]{8}_PASSWORD", account.password_env)
    profile = next(
        s for s in ddl if s.startswith(f"CREATE SETTINGS PROFILE OR REPLACE {account.profile} ")
    )
    assert "SQL_prism_tenant = 't\\' OR 1=1 --\\\\' CONST" in profile
    assert sum(s.startswith("CREATE USER OR REPLACE prism_grafana_acme ") for s in ddl) == 1
    assert sql_string("a\nb\x00") == "'a\\nb\\0'"


@pytest.mark.parametrize("tenant", ["", "*", "x" * 129])
def test_bad_tenants_are_refused(tenant: str) -> None:
    with pytest.raises(LedgerConfigError, match="cannot have a Grafana reader"):
        grants_sql("prism", tenants=[tenant])


def test_cluster_ddl_runs_everywhere() -> None:
    for st in grants_sql("prism", cluster="main"):
        assert " ON CLUSTER `main`" in st, st
    with pytest.raises(LedgerConfigError, match="cluster name"):
        grants_sql("prism", cluster="a b")


def test_the_command_prints_the_script_without_passwords(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLICKHOUSE_WRITER_PASSWORD", "wr1ter-Secret")
    assert main(["grants", "--tenant", "acme", "--database", "ledger"]) == 0
    out = capsys.readouterr().out
    assert "wr1ter-Secret" not in out
    assert "CREATE USER OR REPLACE prism_grafana_acme IDENTIFIED" in out
    assert "GRANT SELECT, INSERT ON ledger.usage_store TO prism_writer_role;" in out


def test_execute_needs_every_password(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in (
        "CLICKHOUSE_WRITER_PASSWORD",
        "CLICKHOUSE_READER_PASSWORD",
        "CLICKHOUSE_GRAFANA_PASSWORD",
    ):
        monkeypatch.delenv(name, raising=False)  # fmt: skip
    monkeypatch.setenv("CLICKHOUSE_WRITER_PASSWORD", "x")
    assert main(["grants", "--execute", "--clickhouse", "http://127.0.0.1:9/"]) == 2
    err = capsys.readouterr().err
    assert "set CLICKHOUSE_READER_PASSWORD, CLICKHOUSE_GRAFANA_PASSWORD" in err


def test_execute_masks_the_passwords_in_a_server_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that echoes the failing statement (with the password) is shown masked."""
    from prism import sinks

    class EchoingServer:
        def command(self, statement: str) -> None:
            if statement.startswith("CREATE USER"):
                raise RuntimeError(f"Syntax error in {statement!r}. Stack trace: 0. x")

    passwords = {
        "CLICKHOUSE_WRITER_PASSWORD": "Wr'1ter\\Secret",
        "CLICKHOUSE_READER_PASSWORD": "Re4derSecret",
        "CLICKHOUSE_GRAFANA_PASSWORD": "Gr4fanaSecret",
    }
    for name, value in passwords.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(sinks, "connect", lambda *a, **k: EchoingServer())
    # the server refused: a failure while running (exit 1), not a usage error
    assert main(["grants", "--execute", "--clickhouse", "http://admin:Adm1nSecret@h/prism"]) == 1
    err = capsys.readouterr().err
    assert "grant statement" in err and "CREATE USER OR REPLACE prism_writer" in err
    for secret in ("Wr'1ter", "Wr\\'1ter", "1ter", "Adm1nSecret", "Stack trace"):
        assert secret not in err, err
    monkeypatch.setenv("CLICKHOUSE_READER_PASSWORD", "replace-with-a-long-random-reader-password")
    assert main(["grants", "--execute"]) == 2
    assert "CLICKHOUSE_READER_PASSWORD still hold the placeholder" in capsys.readouterr().err
