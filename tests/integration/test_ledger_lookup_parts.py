"""Migration 0009: the tables a run's timeline reads keep parts of up to 256 MiB compact.

It must apply to a ledger that already holds data (0001-0008 applied, parts written), leave
every row and every timeline as it was, and make new parts of those tables compact where
the default (10 MiB) made them wide; usage_store, which billing scans, is left alone.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

import pytest

from prism.schemas import LedgerBatch
from prism.sinks import LedgerWriter, SourceRange, migrate, query, run_timeline
from prism.sinks._migrate import _migrations_table_sql, render_migrations
from prism.sinks.testing import event_row, run_row, turn_row, usage_row

pytestmark = pytest.mark.integration

LOOKUP_TABLES = ("runs_store", "turns_store", "run_events_store")
NO_ASYNC = {"async_insert": 0}


def _ledger_at_0008(client: Any, db: str) -> None:
    """The ledger as migrate() left it before 0009 existed."""
    client.command(_migrations_table_sql(db, None))
    for rendered in render_migrations(db):
        m = rendered.migration
        if m.version >= 9:
            continue
        for statement in rendered.statements:
            client.command(statement)
        client.insert(
            f"{db}.schema_migrations",
            [[m.version, m.name, m.checksum, datetime.now(UTC)]],
            column_names=["version", "name", "checksum", "applied_at"],
        )


def _big_runs_part(client: Any, db: str, prefix: str) -> None:
    """One insert of about 20 MiB uncompressed: wide under the default 10 MiB threshold."""
    client.command(
        f"INSERT INTO {db}.runs_store (run_id, status, last_event_at, timeline, version) "
        f"SELECT concat('{prefix}-', toString(number)), 'running', "
        "toDateTime64('2026-11-02 00:00:00', 3, 'UTC'), repeat('x', 500), 1 "
        "FROM numbers(40000)",
        settings=NO_ASYNC,
    )


def _part_types(client: Any, db: str, table: str) -> dict[str, str]:
    rows = client.query(
        "SELECT name, part_type FROM system.parts WHERE database = {db:String} "
        "AND table = {t:String} AND active ORDER BY min_block_number",
        parameters={"db": db, "t": table},
    ).result_rows
    return {str(name): str(kind) for name, kind in rows}


def _snapshot(client: Any, db: str) -> tuple[Any, ...]:
    views = [
        f"SELECT * FROM {db}.{view} ORDER BY ALL"
        for view in ("runs", "turns", "usage", "run_events")
    ]
    return (
        run_timeline(client, db, "r1"),
        *(query(client, sql).rows for sql in views),
    )


def test_an_existing_ledger_takes_0009_and_new_parts_are_compact(
    ch_client: Any, ch_database: str
) -> None:
    db = ch_database
    _ledger_at_0008(ch_client, db)
    first = LedgerBatch(
        runs=[run_row("r1", status="running", version=1)],
        turns=[turn_row("r1", 1, seq=2), turn_row("r1", 2, seq=4)],
        usage=[usage_row("u1", "r1", seq=3), usage_row("u2", "r1", seq=5, turn=2)],
        events=[event_row(f"e{s}", "r1", s) for s in range(6)],
    )
    later = LedgerBatch(  # a terminal below seq 4: turn 2, its usage and events retracted
        runs=[run_row("r1", status="failed", version=5)],
        turns=[dataclasses.replace(turn_row("r1", 2, seq=4), version=5, retracted=True)],
        usage=[usage_row("u2", "r1", seq=5, turn=2, version=5, retracted=True)],
        events=[
            dataclasses.replace(event_row(f"e{s}", "r1", s), version=5, retracted=True)
            for s in (4, 5)
        ],
    )
    writer = LedgerWriter(ch_client, db)
    writer.add(first, SourceRange("prism.agent-events", 0, 0, 9))
    writer.flush()
    _big_runs_part(ch_client, db, "old")
    assert "Wide" in _part_types(ch_client, db, "runs_store").values()  # the default's
    usage_engine = ch_client.query(
        "SELECT engine_full FROM system.tables WHERE database = {db:String} "
        "AND name = 'usage_store'",
        parameters={"db": db},
    ).result_rows
    before = _snapshot(ch_client, db)

    assert migrate(ch_client, db) == ["0009_lookup_parts"]
    assert migrate(ch_client, db) == []
    assert _snapshot(ch_client, db) == before  # no row moved

    old_parts = _part_types(ch_client, db, "runs_store")
    _big_runs_part(ch_client, db, "new")
    new_parts = _part_types(ch_client, db, "runs_store")
    added = [kind for name, kind in new_parts.items() if name not in old_parts]
    assert added == ["Compact"]  # the same 20 MiB insert, now compact
    for table in LOOKUP_TABLES:
        engine = ch_client.query(
            "SELECT engine_full FROM system.tables WHERE database = {db:String} "
            "AND name = {t:String}",
            parameters={"db": db, "t": table},
        ).result_rows[0][0]
        assert "min_bytes_for_wide_part = 268435456" in engine, table
    # billing's table and its day rollup, which reads usage_store's engine, are untouched
    assert (
        ch_client.query(
            "SELECT engine_full FROM system.tables WHERE database = {db:String} "
            "AND name = 'usage_store'",
            parameters={"db": db},
        ).result_rows
        == usage_engine
    )

    # retractions after the upgrade land in compact parts and read as before: exact
    writer.add(later, SourceRange("prism.agent-events", 0, 10, 19))
    writer.flush()
    timeline = run_timeline(ch_client, db, "r1")
    assert timeline["run"]["status"] == "failed"
    assert [t["turn"] for t in timeline["turns"]] == [1]
    assert [u["event_id"] for u in timeline["usage"]] == ["u1"]
    assert [e["seq"] for e in timeline["events"]] == [0, 1, 2, 3]
    for table in ("turns_store", "run_events_store"):
        assert set(_part_types(ch_client, db, table).values()) == {"Compact"}, table
    merged_before = _snapshot(ch_client, db)
    for table in LOOKUP_TABLES:
        ch_client.command(f"OPTIMIZE TABLE {db}.{table} FINAL")
    assert _snapshot(ch_client, db) == merged_before  # merges change no current row
    counted = query(
        ch_client, f"SELECT count() FROM {db}.runs WHERE startsWith(run_id, 'old-')"
    ).rows
    assert counted == [(40000,)]
