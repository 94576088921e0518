"""``LedgerWriter`` on the chDB engine: effectively-once inserts, time flushes, failures.

Counts read the storage tables without FINAL: what is asserted is what ClickHouse stored,
not what the deduplicating views hide.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from typing import Any

import pytest

from prism.pipeline._store import LedgerStore
from prism.schemas import LedgerBatch
from prism.sinks import LedgerWriteError, LedgerWriter, SourceRange, migrate
from prism.sinks.testing import (
    FailingInserts,
    alert_row,
    dead_letter_row,
    event_row,
    quarantine_row,
    run_row,
    turn_row,
    usage_row,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def ledger(ch_client: Any, ch_database: str) -> str:
    migrate(ch_client, ch_database)
    return ch_database


def _stored(client: Any, db: str, table: str) -> int:
    return int(client.query(f"SELECT count() FROM {db}.{table}").result_rows[0][0])


def _full_batch(tag: str = "") -> LedgerBatch:
    return LedgerBatch(
        runs=[run_row(f"r{tag}")],
        turns=[turn_row(f"r{tag}", 1), turn_row(f"r{tag}", 2)],
        usage=[usage_row(f"u{tag}1", f"r{tag}"), usage_row(f"u{tag}2", f"r{tag}", turn=2)],
        events=[event_row(f"e{tag}{i}", f"r{tag}", i) for i in range(4)],
        quarantine=[quarantine_row(f"q{tag}", f"r{tag}")],
        dead_letters=[dead_letter_row(7)],
        alerts=[alert_row(f"a{tag}")],
    )


def test_every_table_is_written(ch_client: Any, ledger: str) -> None:
    writer = LedgerWriter(ch_client, ledger)
    writer.add(_full_batch(), SourceRange("prism.agent-events", 0, 0, 12))
    result = writer.flush()
    assert result.total == 12
    expected = {
        "runs": 1, "turns": 2, "usage": 2, "run_events": 4, "cache_hits_1m": 1,
        "quarantine": 1, "dead_letters": 1, "alerts": 1,
    }  # fmt: skip
    for view, n in expected.items():
        assert _stored(ch_client, ledger, view) == n, view
    kept = ch_client.query(f"SELECT size, sha256, preview FROM {ledger}.dead_letters").result_rows
    assert kept == [(2, hashlib.sha256(b"\xff{").hexdigest(), "\\xff{")]


def test_the_same_batch_twice_leaves_one_copy(ch_client: Any, ledger: str) -> None:
    for _ in range(2):  # e.g. a crash after the insert, before the offset commit
        writer = LedgerWriter(ch_client, ledger)
        writer.add(_full_batch(), SourceRange("prism.agent-events", 0, 0, 12))
        writer.flush()
    for table, n in (("runs_store", 1), ("usage_store", 2), ("run_events_store", 4),
                     ("turns_store", 2), ("alerts_store", 1)):  # fmt: skip
        assert _stored(ch_client, ledger, table) == n, table


def test_same_offsets_but_different_content_is_not_dropped(ch_client: Any, ledger: str) -> None:
    source = SourceRange("prism.agent-events", 0, 0, 12)
    for version in (1, 2):  # the run advanced: same input range, new run version
        writer = LedgerWriter(ch_client, ledger)
        writer.add(LedgerBatch(runs=[run_row("r1", version=version)]), source)
        writer.flush()
    assert _stored(ch_client, ledger, "runs_store") == 2
    assert ch_client.query(f"SELECT version FROM {ledger}.runs").result_rows == [(2,)]


def test_a_quiet_source_is_flushed_by_time(ch_client: Any, ledger: str) -> None:
    now = [0.0]
    writer = LedgerWriter(ch_client, ledger, max_rows=10_000, max_seconds=0.5, clock=lambda: now[0])
    writer.add(LedgerBatch(usage=[usage_row("u1", "r1")]), SourceRange("t", 0, 0, 0))
    assert not writer.should_flush()
    now[0] = 0.6
    assert writer.should_flush()
    writer.flush()
    assert _stored(ch_client, ledger, "usage_store") == 1


def test_persistent_failure_then_recovery_loses_and_doubles_nothing(
    ch_client: Any, ledger: str
) -> None:
    hook = FailingInserts(tables={"usage_store"})
    writer = LedgerWriter(ch_client, ledger, insert_hook=hook)
    writer.add(_full_batch("a"), SourceRange("prism.agent-events", 0, 0, 12))
    hook.failing = True
    for _ in range(3):  # the caller (LedgerStore) retries; each flush tries once
        with pytest.raises(LedgerWriteError) as info:
            writer.flush()
    assert info.value.table == "usage_store" and info.value.transient
    assert _stored(ch_client, ledger, "usage_store") == 0
    assert _stored(ch_client, ledger, "run_events_store") == 4  # stored before the failure

    writer.add(_full_batch("b"), SourceRange("prism.agent-events", 0, 13, 25))
    hook.failing = False
    result = writer.flush()
    assert [r.last_offset for r in result.ranges] == [12, 25]
    assert _stored(ch_client, ledger, "usage_store") == 4
    assert _stored(ch_client, ledger, "run_events_store") == 8
    assert _stored(ch_client, ledger, "runs_store") == 2
    assert writer.pending_rows == 0


def test_lost_acknowledgements_add_no_row(ch_client: Any, ledger: str) -> None:
    hook = FailingInserts(failures=2, after=True)  # stored twice, both acks lost, then ok
    writer = LedgerWriter(ch_client, ledger, insert_hook=hook)
    writer.add(LedgerBatch(usage=[usage_row("u1", "r1"), usage_row("u2", "r1", turn=2)]),
               SourceRange("t", 0, 0, 1))  # fmt: skip
    LedgerStore(writer, sleep=lambda s: None).flush()  # retried by the store
    assert hook.failed == 2
    assert _stored(ch_client, ledger, "usage_store") == 2


def test_a_flush_inserts_its_tables_at_once_on_the_engine(ch_client: Any, ledger: str) -> None:
    both = threading.Barrier(2, timeout=20)  # broken unless the two inserts overlap

    def hook(table: str, insert: Callable[[], object]) -> object:
        if table in ("runs_store", "usage_store"):
            both.wait()
        return insert()

    writer = LedgerWriter(ch_client, ledger, insert_hook=hook)
    writer.add(_full_batch(), SourceRange("prism.agent-events", 0, 0, 12))
    assert writer.flush().total == 12
    assert _stored(ch_client, ledger, "runs_store") == 1
    assert _stored(ch_client, ledger, "usage_store") == 2


def test_tables_failing_at_once_name_the_first_and_what_was_stored_is_not_inserted_again(
    ch_client: Any, ledger: str
) -> None:
    hook = FailingInserts(tables={"usage_store", "turns_store"})
    hook.failing = True
    writer = LedgerWriter(ch_client, ledger, insert_hook=hook)
    writer.add(_full_batch(), SourceRange("prism.agent-events", 0, 0, 12))
    with pytest.raises(LedgerWriteError) as info:
        writer.flush()
    assert info.value.table == "usage_store"  # the first one failed in STORAGE_TABLES' order
    rows = {
        "run_events_store": 4,
        "runs_store": 1,
        "quarantine_store": 1,
        "dead_letters_store": 1,
        "alerts_store": 1,
    }  # the tables that did not fail
    stored = {t for t in rows if _stored(ch_client, ledger, t)}
    assert {"run_events_store", "runs_store"} <= stored  # not queued behind a failed table
    assert writer.pending_rows == 4 + sum(n for t, n in rows.items() if t not in stored)

    hook.failing = False
    hook.calls.clear()
    result = writer.flush()
    assert {"turns_store", "usage_store"} <= set(hook.calls)
    assert not stored & set(hook.calls)  # what was stored is not inserted again
    assert [r.last_offset for r in result.ranges] == [12]
    for table, n in (("runs_store", 1), ("turns_store", 2), ("usage_store", 2),
                     ("run_events_store", 4), ("alerts_store", 1)):  # fmt: skip
        assert _stored(ch_client, ledger, table) == n, table
