"""The read-only statement check of ``prism-pipeline query`` (no engine needed)."""

from __future__ import annotations

import pytest

from prism.pipeline.cli import main
from prism.sinks import LedgerQueryError, LedgerReadOnlyError, check_read_only

READS = [
    "SELECT status, count() FROM runs GROUP BY status",
    "select * from system.tables",
    "WITH t AS (SELECT 1 AS x) SELECT x FROM t",
    "(SELECT 1) UNION ALL (SELECT 2)",
    "SHOW TABLES",
    "SHOW CREATE TABLE runs",
    "DESCRIBE TABLE runs",
    "DESC runs",
    "EXPLAIN SELECT 1",
    "EXISTS TABLE runs_store",
    "SELECT 'DROP TABLE runs_store; INSERT x' AS s",
    "SELECT $$ALTER TABLE x$$",
    "/* DROP */ SELECT 1 -- INSERT INTO x",
    "SELECT 1 # comment with DROP",
    "SELECT 1;",
    "SELECT file_name, url_path FROM t",  # columns named like functions, not calls
    "SELECT 'a\\' ; DROP TABLE x --'",  # one string: \\' escapes the quote in ClickHouse
]


@pytest.mark.parametrize("sql", READS)
def test_reads_pass(sql: str) -> None:
    check_read_only(sql)


@pytest.mark.parametrize(
    ("sql", "says"),
    [
        ("DROP TABLE runs_store", "DROP is not a read-only statement"),
        ("drop table runs_store", "DROP is not a read-only statement"),
        ("INSERT INTO usage_store SELECT * FROM usage_store", "INSERT is not"),
        ("ALTER TABLE runs_store DELETE WHERE 1", "ALTER is not"),
        ("CREATE TABLE x (a Int8) ENGINE = Memory", "CREATE is not"),
        ("TRUNCATE TABLE runs_store", "TRUNCATE is not"),
        ("RENAME TABLE runs_store TO gone", "RENAME is not"),
        ("GRANT ALL ON *.* TO grafana", "GRANT is not"),
        ("SYSTEM STOP MERGES", "SYSTEM is not"),
        ("OPTIMIZE TABLE runs_store FINAL", "OPTIMIZE is not"),
        ("DELETE FROM runs_store WHERE 1", "DELETE is not"),
        ("SET readonly = 0", "SET is not"),
        ("  -- hi\n  DETACH TABLE runs", "DETACH is not"),
        ("SELECT 1; DROP TABLE runs_store", "more than one statement"),
        ("SELECT 1; SELECT 2", "more than one statement"),
        ("WITH x AS (SELECT 1) INSERT INTO t SELECT * FROM x", "uses INSERT"),
        ("EXPLAIN INSERT INTO t VALUES (1)", "uses INSERT"),
        ("SELECT * FROM runs INTO OUTFILE '/tmp/x.csv'", "uses OUTFILE"),
        ("SELECT * FROM file('/etc/passwd', 'LineAsString')", "calls file()"),
        ("SELECT file('/etc/passwd')", "calls file()"),
        ("SELECT * FROM url('http://169.254.169.254/latest', CSV)", "calls url()"),
        ("SELECT * FROM s3('https://b.s3.amazonaws.com/k', 'CSV')", "calls s3()"),
        ("SELECT * FROM remote('10.0.0.1', system.users)", "calls remote()"),
        ("SELECT * FROM remoteSecure ('h', db.t)", "calls remotesecure()"),
        ("SELECT * FROM `url`('http://x', CSV)", "calls url()"),
        ("SELECT * FROM executable('x.sh', CSV, 'a String')", "calls executable()"),
        ("SELECT * FROM /* c */ mysql('h:3306', 'db', 't', 'u', 'p')", "calls mysql()"),
        ("", "no statement"),
        ("-- only a comment", "no statement"),
    ],
)
def test_writes_and_outside_reads_are_refused(sql: str, says: str) -> None:
    with pytest.raises(LedgerReadOnlyError, match=says):
        check_read_only(sql)


def test_refusal_is_a_query_error_of_the_ledger() -> None:
    assert issubclass(LedgerReadOnlyError, LedgerQueryError)


def test_cli_refuses_before_connecting_and_names_the_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The DSN points nowhere: a refusal must not even try to connect.
    code = main(["query", "--clickhouse", "http://127.0.0.1:9/x", "DROP TABLE runs_store"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("prism-pipeline query: error: refused: DROP is not a read-only")
    assert "--allow-writes" in err and "could not reach" not in err


def test_allow_writes_is_documented_in_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["query", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--allow-writes" in text and "readonly=1" in text and "file()" in text
