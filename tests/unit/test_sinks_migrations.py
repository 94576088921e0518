"""The generated migration DDL: single node, cluster, TTL, and agreement with the ledger rows."""

from __future__ import annotations

import re

import pytest

from prism.schemas import DeadLetterRow
from prism.sinks import LedgerConfigError, MigrationError, load_migrations
from prism.sinks._migrate import render_migrations, render_sql
from prism.sinks._tables import columns_of

VERSIONED = {
    "runs_store",
    "turns_store",
    "usage_store",
    "alerts_store",
    "run_events_store",
    "quarantine_store",
    "ingest_state",
    "prices_store",
    # 0006: channel operations
    "channel_operations_store",
    "channel_denials_store",
    "channel_quarantine_store",
    "channel_watermark_store",
}
APPEND_ONLY = {
    "dead_letters_store",
    "worker_progress_store",
    "billing_rollup_store",  # one refresh's lines, read by its manifest
    "billing_rollup_manifest",
}


def _creates(statements: list[str]) -> dict[str, str]:
    """The DDL each table ends up with: a table rebuilt as ``<t>_v2`` takes that DDL."""
    out = {}
    for st in statements:
        m = re.match(r"CREATE TABLE IF NOT EXISTS \w+\.(\w+)", st)
        if m:
            out[m[1].removesuffix("_v2")] = st
    dropped = {
        m[1] for st in statements if (m := re.match(r"DROP TABLE IF EXISTS \w+\.(\w+) ", st))
    }
    return {t: ddl for t, ddl in out.items() if t not in dropped}


def _all_statements(**kw: object) -> list[str]:
    return [s for r in render_migrations("prism", **kw) for s in r.statements]  # type: ignore[arg-type]


def test_migrations_are_numbered_from_one_without_gaps() -> None:
    versions = [m.version for m in load_migrations()]
    assert versions == list(range(1, len(versions) + 1))


def test_single_node_ddl() -> None:
    statements = _all_statements()
    creates = _creates(statements)
    assert set(creates) == VERSIONED | APPEND_ONLY
    for st in statements:
        assert "${" not in st and "ON CLUSTER" not in st
    for table in VERSIONED:
        assert "ENGINE = ReplacingMergeTree(version)" in creates[table], table
    for table in APPEND_ONLY:
        assert "ENGINE = ReplacingMergeTree\n" in creates[table], table
    for table, ddl in creates.items():
        assert "non_replicated_deduplication_window = 10000" in ddl, table
        assert "Replicated" not in ddl
    assert "TTL toDateTime(received_at) + INTERVAL 90 DAY" in creates["run_events_store"]
    assert [t for t, ddl in creates.items() if "TTL" in ddl] == [
        "run_events_store",
        "worker_progress_store",
    ]
    assert "cost Nullable(Decimal(38, 12))" in creates["usage_store"]
    assert "ORDER BY run_id\n" in creates["runs_store"]
    assert "ORDER BY (run_id, kind, turn, attempt)" in creates["turns_store"]
    assert "ORDER BY (toDate(recorded_at), run_id, event_id)" in creates["usage_store"]
    assert "ORDER BY (source, partition, offset)" in creates["dead_letters_store"]


def test_cluster_ddl_is_replicated_and_on_cluster() -> None:
    statements = _all_statements(cluster="prod_cluster", raw_event_ttl_days=30)
    creates = _creates(statements)
    for st in statements:
        # an INSERT runs on one replica and replicates; everything else runs on the cluster
        assert st.startswith("INSERT") or "ON CLUSTER `prod_cluster`" in st, st[:80]
    path = "'/clickhouse/tables/{shard}/{database}/{table}', '{replica}'"
    assert f"ENGINE = ReplicatedReplacingMergeTree({path}, version)" in creates["runs_store"]
    assert f"ENGINE = ReplicatedReplacingMergeTree({path}, version)" in creates["usage_store"]
    assert f"ENGINE = ReplicatedReplacingMergeTree({path})\n" in creates["dead_letters_store"]
    for table, ddl in creates.items():
        assert "replicated_deduplication_window = 10000" in ddl, table
        assert "non_replicated" not in ddl
    assert "INTERVAL 30 DAY" in creates["run_events_store"]
    views = {s.split()[4] for s in statements if s.startswith("CREATE OR REPLACE VIEW")}
    assert len(views) == 11 + 5  # 0006: four channel views and guardrail_denials
    assert all(v.startswith("prism.") for v in views)


_ADD_RE = re.compile(r"ADD COLUMN IF NOT EXISTS (\w+) .*? AFTER (\w+)")


def test_dead_letters_keep_a_preview_not_the_bytes() -> None:
    statements = _all_statements()
    body = _creates(statements)["dead_letters_store"].split("(\n", 1)[1].split("\n)\nENGINE")[0]
    columns = [line.split()[0] for line in body.splitlines() if line.strip()]
    for st in statements:
        if st.startswith("ALTER TABLE prism.dead_letters_store "):
            for name, after in _ADD_RE.findall(st):
                columns.insert(columns.index(after) + 1, name)
    # The row's fields, then the retired raw bytes (kept for rows of older ledgers).
    assert columns == [*columns_of(DeadLetterRow)[:-1], "raw", "received_at"]
    # The last definition of the view wins: it shows what is kept, never the raw bytes.
    view = [s for s in statements if s.startswith("CREATE OR REPLACE VIEW prism.dead_letters ")][-1]
    assert "raw" not in view.split(" AS", 1)[1]
    assert "size, sha256, preview" in view


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"database": "prism-db"}, "'prism-db' is not a plain identifier"),
        ({"database": "prism", "cluster": "main cluster"}, "cluster name 'main cluster'"),
        ({"database": "prism", "raw_event_ttl_days": 0}, "raw_event_ttl_days=0"),
    ],
)
def test_bad_settings_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(LedgerConfigError, match=message):
        render_migrations(**kwargs)  # type: ignore[arg-type]


def test_unknown_placeholder_is_an_error() -> None:
    with pytest.raises(MigrationError, match=r"unknown placeholder '\$\{nope\}'"):
        render_sql("SELECT ${nope}", "prism")
