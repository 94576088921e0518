"""``prism-pipeline query`` is read-only unless ``--allow-writes``, on a real chDB ledger.

The check is an allow-list decided by ClickHouse's own parser: the reads below pass, and
the hostile statements (a table function in a CTE, a JOIN, an IN subquery; system tables;
another database; several statements; writes; INTO OUTFILE; SETTINGS) are refused with
the reason, before anything runs. The CLI runs in its own process per command (one chDB
engine path per process), the way a user inspects a ledger. The second layer,
ClickHouse's ``readonly`` setting, is also run alone in this process to show it holds even
for a statement the check let through.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from prism.pipeline.cli import main
from prism.sinks import LedgerQueryError, LedgerReadOnlyError, migrate, read_only_query
from prism.sinks import _readonly as readonly_module
from prism.sinks._readonly import QuerySyntaxError

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
    assert leak.returncode == 2 and "table function file() is not allowed" in leak.stderr

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
    monkeypatch.setattr(readonly_module, "check_read_only", lambda client, sql, *a: sql)
    insert = FORGED.replace("usage_store", f"{ch_database}.usage_store")
    with pytest.raises(LedgerQueryError, match="readonly"):
        read_only_query(ch_client, insert, database=ch_database)
    with pytest.raises(LedgerQueryError, match="readonly"):
        read_only_query(
            ch_client, "SELECT * FROM file('/etc/hostname', 'LineAsString')", database=ch_database
        )
    count = f"SELECT count() FROM {ch_database}.usage"
    [(n,)] = read_only_query(ch_client, count, database=ch_database).rows
    assert n == 0
    # The refused statements ran on a handle of their own: this client still writes.
    ch_client.command(insert)
    assert read_only_query(ch_client, count, database=ch_database).rows == [(1,)]


READS = [
    "SELECT status, count() FROM runs GROUP BY status",
    "select count() from {db}.runs",
    "WITH t AS (SELECT 1 AS x) SELECT x FROM t",
    "WITH r AS (SELECT run_id FROM runs) SELECT count() FROM r JOIN usage u USING (run_id)",
    "SELECT count() FROM runs WHERE run_id IN (SELECT run_id FROM {db}.usage_store)",
    "SELECT (SELECT count() FROM usage) AS n",
    "(SELECT 1) UNION ALL (SELECT 2)",
    "SHOW TABLES",
    "SHOW TABLES FROM {db}",
    "SHOW CREATE TABLE runs",
    "DESCRIBE TABLE runs",
    "DESC runs",
    "EXPLAIN SELECT count() FROM runs",
    "EXISTS TABLE runs_store",
    "SELECT 'DROP TABLE runs_store; INSERT x' AS s",
    "SELECT $$ALTER TABLE x$$",
    "/* DROP */ SELECT 1 -- INSERT INTO x",
    "SELECT 1 # comment with DROP",
    "SELECT 1;",
    "SELECT file_name, url_path FROM (SELECT 1 AS file_name, 2 AS url_path)",
    "SELECT 'a\\' ; DROP TABLE x --'",  # one string: \\' escapes the quote in ClickHouse
    "SELECT count() FROM runs WHERE tenant_id = {{tenant:String}}",
    "FROM runs SELECT count()",
    "/* c */ ((SELECT 1))",
]


@pytest.fixture
def ledger(ch_client: Any, ch_database: str) -> str:
    migrate(ch_client, ch_database)
    return ch_database


@pytest.mark.parametrize("sql", READS)
def test_reads_pass(ch_client: Any, ledger: str, sql: str) -> None:
    read_only_query(ch_client, sql.format(db=ledger), {"tenant": "acme"}, database=ledger)


HOSTILE = [
    # table functions, wherever they hide
    ("WITH u AS (SELECT * FROM url('http://127.0.0.1:9/x', CSV)) SELECT * FROM u",
     "table function url() is not allowed"),
    ("SELECT * FROM runs AS r JOIN s3('http://127.0.0.1:9/k', 'CSV') AS s ON 1",
     "table function s3() is not allowed"),
    ("SELECT count() FROM runs WHERE run_id IN (SELECT * FROM file('/etc/passwd', 'LineAsString'))",
     "table function file() is not allowed"),
    ("SELECT (SELECT count() FROM remote('127.0.0.1:9', system.one))",
     "table function remote() is not allowed"),
    ("SELECT * FROM merge('{db}', '.*')", "table function merge() is not allowed"),
    ("SELECT * FROM numbers(3)", "table function numbers() is not allowed"),
    ("SELECT * FROM `url`('http://x', CSV)", "table function url() is not allowed"),
    ("SELECT * FROM /* c */ mysql('h:3306', 'db', 't', 'u', 'p')",
     "table function mysql() is not allowed"),
    ("DESCRIBE TABLE url('http://x', CSV)", "table function url() is not allowed"),
    ("EXPLAIN SELECT * FROM file('/etc/passwd', 'LineAsString')",
     "table function file() is not allowed"),
    ("SELECT file('/etc/passwd')", "function file() is not allowed"),
    ("SELECT joinGet('system.users', 'name', 1)", "function joinGet() is not allowed"),
    # system tables and other databases
    ("SELECT * FROM system.users", "system.users is not allowed"),
    ("SELECT (SELECT count() FROM system.processes) AS n", "system.processes is not allowed"),
    ("SELECT count() FROM runs WHERE run_id GLOBAL IN system.users",
     "system.users is not allowed"),
    ("SELECT 1 INTERSECT SELECT 1 FROM system.one", "system.one is not allowed"),
    ("SELECT * FROM {other}.secrets", "{other}.secrets is not allowed"),
    ("WITH s AS (SELECT * FROM {other}.secrets) SELECT * FROM runs JOIN s ON 1",
     "{other}.secrets is not allowed"),
    ("SHOW TABLES FROM system", "SHOW TABLES FROM system is not allowed"),
    ("SHOW CREATE TABLE {other}.secrets", "{other}.secrets is not allowed"),
    ("SELECT * FROM {db}.nope", "{db}.nope is not one of the ledger's tables"),
    # several statements, writes, session and server statements
    ("SELECT 1; DROP TABLE runs_store", "more than one statement"),
    ("SELECT 1; SELECT 2", "more than one statement"),
    ("INSERT INTO usage_store SELECT * FROM usage_store", "INSERT is not allowed"),
    ("WITH x AS (SELECT 1) INSERT INTO t SELECT * FROM x", "INSERT is not allowed"),
    ("ALTER TABLE runs_store DELETE WHERE 1", "ALTER is not allowed"),
    ("DROP TABLE runs_store", "DROP is not allowed"),
    ("TRUNCATE TABLE runs_store", "TRUNCATE is not allowed"),
    ("SET readonly = 0", "SET is not allowed"),
    ("KILL QUERY WHERE 1", "KILL QUERY is not allowed"),
    ("SYSTEM STOP MERGES", "SYSTEM STOP is not allowed"),
    ("SHOW PROCESSLIST", "SHOW PROCESSLIST is not allowed"),
    ("SHOW GRANTS", "SHOW GRANTS is not allowed"),
    ("EXPLAIN INSERT INTO t VALUES (1)", "EXPLAIN of InsertQuery is not allowed"),
    ("  -- hi\n  DETACH TABLE runs", "DETACH is not allowed"),
    # output and settings clauses
    ("SELECT * FROM runs INTO OUTFILE '{out}'", "INTO OUTFILE is not allowed"),
    ("SELECT 1 SETTINGS readonly = 0", "SETTINGS are not allowed"),
    ("SELECT * FROM (SELECT 1 SETTINGS readonly = 0)", "SETTINGS are not allowed"),
    ("SELECT * FROM runs FORMAT JSON", "FORMAT JSON is not allowed"),
    ("", "no statement to run"),
    ("-- only a comment", "no statement to run"),
]  # fmt: skip


@pytest.mark.parametrize(("sql", "says"), HOSTILE)
def test_hostile_statements_are_refused_with_the_reason(
    ch_client: Any, ledger: str, tmp_path: Path, sql: str, says: str
) -> None:
    other = f"{ledger}_other"
    ch_client.command(f"CREATE DATABASE IF NOT EXISTS {other}")
    try:
        ch_client.command(f"CREATE TABLE IF NOT EXISTS {other}.secrets (a Int8) ENGINE = Memory")
        out = tmp_path / "leak.csv"
        values = {"db": ledger, "other": other, "out": out}
        with pytest.raises(LedgerReadOnlyError, match=re.escape(says.format(**values))):
            read_only_query(ch_client, sql.format(**values), database=ledger)
        assert not out.exists()
        assert ch_client.query(f"EXISTS TABLE {ledger}.runs_store").result_rows == [(1,)]
    finally:
        ch_client.command(f"DROP DATABASE IF EXISTS {other} SYNC")


def test_the_ledger_tables_come_from_the_ledger_database(ch_client: Any, ledger: str) -> None:
    ch_client.command(f"CREATE TABLE {ledger}.extra (a Int8) ENGINE = Memory")
    ch_client.command(f"INSERT INTO {ledger}.extra VALUES (7)")
    assert read_only_query(ch_client, f"SELECT a FROM {ledger}.extra", database=ledger).rows == [
        (7,)
    ]


@pytest.mark.parametrize(
    ("sql", "says"),
    [
        ("SELEC 1", "parse error: Syntax error: failed at position 7 (1): 1. Expected one of:"),
        ("SELEC status FROM runs", "parse error: 'SELEC' is not a statement keyword (ClickHouse "
         "would read it as 'SELECT SELEC AS status FROM runs'); start with SELECT or WITH"),
        ("SELECT status FROM runs WHERE", "parse error: Syntax error: failed at position"),
        ("SELECT (1", "parse error: Syntax error: failed at position 10 (end of query): (1. "
         "Unmatched parentheses"),
    ],
)  # fmt: skip
def test_a_statement_that_does_not_parse_gets_clickhouses_syntax_error(
    ch_client: Any, chdb_path: Path, ledger: str, capsys: pytest.CaptureFixture[str],
    sql: str, says: str,
) -> None:  # fmt: skip
    with pytest.raises(QuerySyntaxError, match=re.escape(says)):
        read_only_query(ch_client, sql, database=ledger)
    code = main(["query", sql, "--clickhouse", f"chdb://{chdb_path}", "--database", ledger])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith(f"prism-pipeline query: error: {says}"), err
    assert "--allow-writes" not in err and "formatQuery" not in err and len(err.splitlines()) == 1


def test_cli_names_what_was_refused_and_why(
    ch_client: Any, chdb_path: Path, ledger: str, capsys: pytest.CaptureFixture[str]
) -> None:
    dsn = ["--clickhouse", f"chdb://{chdb_path}", "--database", ledger]
    assert main(["query", "SELECT * FROM system.users", *dsn]) == 2
    assert capsys.readouterr().err.strip() == (
        "prism-pipeline query: error: refused: system.users is not allowed: `query` reads only "
        f"the tables and views of the ledger database {ledger!r}"
    )
    assert main(["query", "DROP TABLE runs_store", *dsn]) == 2
    err = capsys.readouterr().err
    assert err.startswith("prism-pipeline query: error: refused: DROP is not allowed")
    assert "--allow-writes" in err


def test_a_missing_ledger_database_is_named_and_not_created(
    ch_client: Any, chdb_path: Path, ledger: str, capsys: pytest.CaptureFixture[str]
) -> None:  # the engine holds a ledger, but not in the database asked for
    for argv in (
        ["query", "SELECT 1"],
        ["billing", "--from", "2026-11-01", "--to", "2026-12-01"],
        ["invoice", "--month", "2026-11"],
        ["billing"],
        ["invoice"],
        ["report", "--out", "x.html"],
    ):
        code = main([*argv, "--clickhouse", f"chdb://{chdb_path}", "--database", "t_missing"])
        assert code == 2
        assert capsys.readouterr().err.strip() == (
            f"prism-pipeline {argv[0]}: error: no ledger at {chdb_path} (it has no database "
            "'t_missing'; run `make demo`, or pass --clickhouse or --database)"
        )
    assert ch_client.query("EXISTS DATABASE t_missing").result_rows == [(0,)]
