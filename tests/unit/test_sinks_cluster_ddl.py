"""The ``PRISM_CLICKHOUSE_CLUSTER`` DDL is accepted by ClickHouse's own parser.

No replicated ClickHouse runs in this project's tests (Replicated tables need Keeper and
several servers), so this is the strongest check available here: every statement
``migrate`` would send to a cluster goes through ``formatQuery`` of the embedded engine
(the server's parser) and keeps its ``ON CLUSTER`` clause and Replicated engine. It runs
in a child process, since chDB allows one engine per process.
"""

from __future__ import annotations

import json
import subprocess
import sys

from prism.sinks._migrate import _migrations_table_sql, render_migrations

_PARSE = """
import json, sys, chdb
out = []
for st in json.load(sys.stdin):
    literal = "'" + st.replace("\\\\", "\\\\\\\\").replace("'", "\\\\'") + "'"
    try:
        res = chdb.query(f"SELECT formatQuery({literal}) AS q", "JSONEachRow")
        out.append(json.loads(res.bytes())["q"])
    except Exception as exc:
        out.append("ERROR " + str(exc).splitlines()[0])
print(json.dumps(out))
"""


def parse(statements: list[str]) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", _PARSE],
        input=json.dumps(statements),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_every_cluster_statement_parses_and_keeps_on_cluster_and_replication() -> None:
    statements = [_migrations_table_sql("prism", "prism_cluster")]
    statements += [
        s for r in render_migrations("prism", cluster="prism_cluster") for s in r.statements
    ]
    parsed = parse([*statements, "CREATE TABLE broken ("])
    *ok, broken = parsed
    assert broken.startswith("ERROR"), "the parser check must be able to fail"
    failures = [
        (st[:120], p) for st, p in zip(statements, ok, strict=True) if p.startswith("ERROR")
    ]
    assert failures == []
    # an INSERT runs on one replica and replicates; everything else runs on the cluster
    assert all("ON CLUSTER prism_cluster" in p for p in ok if not p.startswith("INSERT")), [
        p[:120] for p in ok
    ]
    tables = [p for p in ok if p.startswith("CREATE TABLE")]
    # schema_migrations, the eight storage tables of 0001, the four tables 0003 rebuilds,
    # the ingest state, the price book (0005), the four channel tables (0006) and the
    # workers' progress (0007), billing's rollup lines and manifest (0008)
    assert len(tables) == 16 + 4 + 2
    assert all(
        "ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}" in p for p in tables
    )
