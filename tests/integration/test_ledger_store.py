"""The ledger on the chDB engine: migrations, connect(), the views and value round trips."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from prism import sinks
from prism.schemas import LedgerBatch, RunRow
from prism.sinks import (
    LedgerConfigError,
    LedgerWriter,
    MigrationError,
    SourceRange,
    load_migrations,
    migrate,
)
from prism.sinks._tables import columns_of
from prism.sinks.testing import run_row, turn_row, usage_row

pytestmark = pytest.mark.integration

RUNS_COLUMNS = [
    "run_id",
    "tenant_id",
    "account_id",
    "user_id",
    "agent_id",
    "provider",
    "model",
    "parent_run_id",
    "delegation_id",
    "bundle_digest",
    "status",
    "terminal_type",
    "started_at",
    "finished_at",
    "stop_reason",
    "stop_detail",
    "finish_reason",
    "error_code",
    "failure_class",
    "model_turns",
    "deterministic_turns",
    "cache_hit_rate",
    "exhaustion_limit",
    "exhaustion_maximum",
    "exhaustion_observed",
    "exhaustion_axis",
    "missing_ranges",
    "missing_count",
    "usage_mismatch",
    "clock_skew",
]
USAGE_COLUMNS = [
    "event_id",
    "run_id",
    "tenant_id",
    "provider",
    "model",
    "scope",
    "turn",
    "attempt",
    "input_tokens",
    "output_tokens",
    "total_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "cost",
    "currency",
    "estimated",
    "confidence",
    "recorded_at",
]


def _schema(client: Any, db: str) -> list[tuple[Any, ...]]:
    return client.query(
        "SELECT name, engine, create_table_query FROM system.tables "
        "WHERE database = {db:String} ORDER BY name",
        parameters={"db": db},
    ).result_rows


def _write(client: Any, db: str, batch: LedgerBatch, first: int = 0) -> None:
    writer = LedgerWriter(client, db)
    writer.add(batch, SourceRange("prism.agent-events", 0, first, first + len(batch)))
    writer.flush()


def test_migrate_twice_changes_nothing(ch_client: Any, ch_database: str) -> None:
    shipped = load_migrations()
    assert migrate(ch_client, ch_database) == [f"{m.version:04d}_{m.name}" for m in shipped]
    before = _schema(ch_client, ch_database)
    recorded = ch_client.query(
        f"SELECT version, name, checksum, applied_at FROM {ch_database}.schema_migrations "
        "ORDER BY version"
    ).result_rows
    assert migrate(ch_client, ch_database) == []
    assert _schema(ch_client, ch_database) == before
    again = ch_client.query(
        f"SELECT version, name, checksum, applied_at FROM {ch_database}.schema_migrations "
        "ORDER BY version"
    ).result_rows
    assert again == recorded
    assert [r[:2] for r in recorded] == [(m.version, m.name) for m in shipped]
    assert [r[:2] for r in recorded][:2] == [(1, "storage"), (2, "views")]
    names = {r[0] for r in before}
    assert set(sinks.VIEWS) <= names
    assert {"runs_store", "usage_store", "schema_migrations"} <= names


def test_an_edited_applied_migration_is_refused(ch_client: Any, ch_database: str) -> None:
    migrate(ch_client, ch_database)
    ch_client.insert(
        f"{ch_database}.schema_migrations",
        [[1, "storage", "0" * 64, datetime.now(UTC)]],
        column_names=["version", "name", "checksum", "applied_at"],
    )
    with pytest.raises(MigrationError, match=r"migration 0001_storage was applied .* now has"):
        migrate(ch_client, ch_database)


def test_a_newer_ledger_is_refused(ch_client: Any, ch_database: str) -> None:
    migrate(ch_client, ch_database)
    ch_client.insert(
        f"{ch_database}.schema_migrations",
        [[99, "future", "f" * 64, datetime.now(UTC)]],
        column_names=["version", "name", "checksum", "applied_at"],
    )
    with pytest.raises(MigrationError, match=r"has migrations \[99\].*upgrade prism-pipeline"):
        migrate(ch_client, ch_database)


def test_raw_event_ttl_follows_the_setting(ch_client: Any, ch_database: str) -> None:
    def ttl() -> str:
        return ch_client.query(
            "SELECT engine_full FROM system.tables WHERE database = {db:String} "
            "AND name = 'run_events_store'",
            parameters={"db": ch_database},
        ).result_rows[0][0]

    migrate(ch_client, ch_database, raw_event_ttl_days=90)
    assert "toIntervalDay(90)" in ttl()
    migrate(ch_client, ch_database, raw_event_ttl_days=14)
    assert "toIntervalDay(14)" in ttl()
    usage_ddl = _schema(ch_client, ch_database)
    assert not any("TTL" in ddl for name, _, ddl in usage_ddl if name == "usage_store")


def test_views_expose_the_documented_columns(ch_client: Any, ch_database: str) -> None:
    migrate(ch_client, ch_database)

    def columns(view: str) -> list[str]:
        return list(ch_client.query(f"SELECT * FROM {ch_database}.{view} LIMIT 0").column_names)

    runs = columns("runs")
    assert set(RUNS_COLUMNS) <= set(runs)
    assert runs == list(columns_of(RunRow))
    assert set(USAGE_COLUMNS) <= set(columns("usage"))
    assert columns("cache_hits_1m") == [
        "minute", "tenant_id", "provider", "model", "turns", "turns_reporting_cache",
        "turns_not_reporting_cache", "input_tokens", "input_tokens_reporting_cache",
        "cache_read_tokens", "cache_write_tokens", "cache_hit_rate",
    ]  # fmt: skip
    assert columns("billing_usage")[-1] == "superseded"
    for view in ("quarantine", "dead_letters", "alerts", "turns", "run_events"):
        assert columns(view)


def test_absent_stays_null_and_zero_stays_zero(ch_client: Any, ch_database: str) -> None:
    migrate(ch_client, ch_database)
    _write(
        ch_client,
        ch_database,
        LedgerBatch(
            usage=[
                usage_row(
                    "absent",
                    "r1",
                    cache_read_tokens=None,
                    cache_write_tokens=None,
                    cost=None,
                    currency=None,
                ),
                usage_row(
                    "zero",
                    "r1",
                    turn=2,
                    cache_read_tokens=0,
                    cache_write_tokens=0,
                    cost=Decimal("0"),
                    currency="USD",
                ),
            ],
            turns=[
                turn_row("r1", 1, cache_hit_rate=None),
                turn_row("r1", 2, cache_read_tokens=0, cache_hit_rate=0.0),
            ],
        ),
    )
    rows = dict(
        (r[0], r[1:])
        for r in ch_client.query(
            f"SELECT event_id, cache_read_tokens, cache_write_tokens, cost, currency "
            f"FROM {ch_database}.usage"
        ).result_rows
    )
    assert rows["absent"] == (None, None, None, None)
    assert rows["zero"] == (0, 0, Decimal("0"), "USD")
    turns = ch_client.query(
        f"SELECT turn, cache_read_tokens, cache_hit_rate FROM {ch_database}.turns ORDER BY turn"
    ).result_rows
    assert turns == [(1, None, None), (2, 0, 0.0)]


def test_cost_keeps_its_decimals(ch_client: Any, ch_database: str) -> None:
    migrate(ch_client, ch_database)
    cost = Decimal("12345678.123456789012")
    _write(ch_client, ch_database, LedgerBatch(usage=[usage_row("e1", "r1", cost=cost)]))
    stored = ch_client.query(f"SELECT cost FROM {ch_database}.usage").result_rows[0][0]
    assert stored == cost


def test_runs_view_returns_the_highest_version(ch_client: Any, ch_database: str) -> None:
    migrate(ch_client, ch_database)
    t0 = datetime(2025, 1, 31, 23, 59, tzinfo=UTC)
    # versions written out of order, in separate inserts, the last one a month later
    _write(ch_client, ch_database, LedgerBatch(runs=[run_row("r1", version=2, status="running",
           last_event_at=t0, closed=False)]), first=0)  # fmt: skip
    gaps = {"missing_ranges": [(2, 2), (5, 5)], "missing_count": 2}
    _write(ch_client, ch_database, LedgerBatch(runs=[run_row("r1", version=3, status="failed",
           last_event_at=t0 + timedelta(minutes=5), **gaps)]), first=10)  # fmt: skip
    _write(ch_client, ch_database, LedgerBatch(runs=[run_row("r1", version=1, status="running",
           last_event_at=t0)]), first=20)  # fmt: skip
    rows = ch_client.query(
        "SELECT run_id, status, version, missing_ranges, missing_count, closed "
        f"FROM {ch_database}.runs"
    ).result_rows
    assert rows == [("r1", "failed", 3, [(2, 2), (5, 5)], 2, True)]
    stored = ch_client.query(f"SELECT count() FROM {ch_database}.runs_store").result_rows[0][0]
    assert stored == 3  # the versions are all stored; the view shows the current one


def test_connect_reuses_the_engine_of_this_process(
    ch_client: Any, ch_database: str, chdb_path: Path, tmp_path: Path
) -> None:
    first = sinks.connect(f"chdb://{chdb_path}", ch_database)
    assert sinks.connect(f"chdb://{chdb_path}/", None) is first
    assert first.database == ch_database
    assert first.query("SELECT 41 + 1").result_rows == [(42,)]
    with pytest.raises(LedgerConfigError, match="one engine per process") as info:
        sinks.connect(f"chdb://{tmp_path}/other", ch_database)
    assert str(chdb_path) in str(info.value) and "other" in str(info.value)


def test_storage_columns_are_the_ledger_row_fields_in_order(
    ch_client: Any, ch_database: str
) -> None:
    """After every migration, each storage table's columns are its row class's fields (plus
    the dead letters' raw bytes, kept for rows written before 0004 and filled by no one)."""
    from prism.sinks import STORAGE_TABLES

    retired = {"dead_letters_store": {"raw"}}
    migrate(ch_client, ch_database)
    for table, row_class in STORAGE_TABLES.values():
        names = [
            str(r[0])
            for r in ch_client.query(
                "SELECT name FROM system.columns WHERE database = {db:String} "
                "AND table = {t:String} ORDER BY position",
                parameters={"db": ch_database, "t": table},
            ).result_rows
            if str(r[0]) not in retired.get(table, set())
        ]
        assert tuple(names) == columns_of(row_class), table
