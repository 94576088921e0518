"""``LedgerWriter`` batching, tokens and failure handling, against a recording client.

The client double records each insert (table, token, columns); the real engine is exercised
by tests/integration/test_ledger_writer.py.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
from clickhouse_connect.driver.exceptions import DatabaseError

from prism.schemas import LedgerBatch
from prism.sinks import (
    STORAGE_TABLES,
    LedgerConfigError,
    LedgerWriteError,
    LedgerWriter,
    SourceRange,
)
from prism.sinks._tables import columns_of
from prism.sinks.testing import FailingInserts, event_row, run_row, usage_row

_COLUMNS = {table: columns_of(cls) for table, cls in STORAGE_TABLES.values()}


class RecordingClient:
    """Records inserts as (table, insert_deduplication_token, columns)."""

    def __init__(self) -> None:
        self.inserts: list[tuple[str, str, list[list[Any]]]] = []
        self.database = None

    def query(self, sql: str, parameters: dict[str, str]) -> Any:
        rows = [(c, "LowCardinality(String)") for c in _COLUMNS[parameters["table"]]]
        return SimpleNamespace(result_rows=rows)

    def create_insert_context(self, table: str, **kw: Any) -> Any:
        return SimpleNamespace(table=table, data=None, **kw)

    def insert(self, context: Any) -> None:
        token = context.settings["insert_deduplication_token"]
        self.inserts.append((context.table, token, [list(c) for c in context.data]))


def _writer(client: RecordingClient, **kw: Any) -> LedgerWriter:
    return LedgerWriter(client, "prism", **kw)  # type: ignore[arg-type]


def _batch(n: int = 2, tag: str = "") -> LedgerBatch:
    return LedgerBatch(
        runs=[run_row(f"r{tag}")],
        usage=[usage_row(f"e{tag}{i}", f"r{tag}") for i in range(n)],
    )


def test_add_only_buffers_and_size_triggers_a_flush() -> None:
    client = RecordingClient()
    writer = _writer(client, max_rows=4)
    writer.add(_batch(2), SourceRange("t", 0, 0, 2))
    assert not writer.should_flush()
    assert client.inserts == []
    writer.add(_batch(1, "b"), SourceRange("t", 0, 3, 4))
    assert writer.pending_rows == 5
    assert writer.should_flush()


def test_age_triggers_a_flush_on_a_quiet_source() -> None:
    now = [100.0]
    writer = _writer(RecordingClient(), max_rows=1000, max_seconds=2.0, clock=lambda: now[0])
    assert not writer.should_flush()
    writer.add(_batch(1), SourceRange("t", 0, 0, 0))
    now[0] = 101.9
    assert not writer.should_flush()
    now[0] = 102.0
    assert writer.should_flush()
    writer.flush()
    assert not writer.should_flush()


def test_one_insert_per_non_empty_table_with_source_and_content_tokens() -> None:
    client = RecordingClient()
    writer = _writer(client)
    writer.add(_batch(2), SourceRange("prism.agent-events", 3, 10, 14))
    writer.add(_batch(1, "b"), SourceRange("prism.agent-events", 3, 15, 19))
    result = writer.flush()
    assert sorted(t for t, _, _ in client.inserts) == ["runs_store", "usage_store"]
    assert result.rows == {"usage_store": 3, "runs_store": 2}
    assert result.total == 5 and result.attempts == 2
    assert [r.last_offset for r in result.ranges] == [14, 19]
    token = dict((t, tok) for t, tok, _ in client.inserts)["usage_store"]
    assert re.fullmatch(r"usage_store:prism\.agent-events:3:10-19:[0-9a-f]{64}", token)
    assert writer.pending_rows == 0
    assert writer.flush().rows == {}


def test_tokens_depend_on_content_and_are_stable() -> None:
    tokens = []
    for tag in ("", "", "x"):
        client = RecordingClient()
        writer = _writer(client)
        writer.add(LedgerBatch(usage=[usage_row("e1", f"r{tag}")]), SourceRange("t", 0, 5, 5))
        writer.flush()
        tokens.append(client.inserts[0][1])
    assert tokens[0] == tokens[1]
    assert tokens[0] != tokens[2]
    assert tokens[0].rsplit(":", 1)[0] == tokens[2].rsplit(":", 1)[0] == "usage_store:t:0:5-5"


def test_ranges_of_several_partitions_are_merged_in_the_token() -> None:
    client = RecordingClient()
    writer = _writer(client)
    writer.add(_batch(1), SourceRange("t", 1, 5, 5))
    writer.add(_batch(1, "b"), SourceRange("t", 0, 10, 19))
    writer.add(_batch(1, "c"), SourceRange("t", 0, 0, 9))
    writer.flush()
    assert client.inserts[0][1].startswith("usage_store:t:0:0-19,t:1:5-5:")


def test_datetimes_travel_as_epoch_milliseconds_and_naive_means_utc() -> None:
    client = RecordingClient()
    writer = _writer(client)
    aware = datetime(2025, 1, 2, 3, 4, 5, 678_999, tzinfo=UTC)
    naive = datetime(2025, 1, 2, 3, 4, 5, 678_000)
    writer.add(
        LedgerBatch(events=[event_row("a", "r", ts=aware), event_row("b", "r", 1, ts=naive)]),
        SourceRange("t", 0, 0, 1),
    )
    writer.flush()
    _, _, columns = client.inserts[0]
    ts = columns[columns_of(STORAGE_TABLES["events"][1]).index("ts")]
    assert ts == [1735787045678, 1735787045678]


def test_persistent_failure_keeps_rows_and_a_later_flush_uses_the_same_tokens() -> None:
    client = RecordingClient()
    hook = FailingInserts(after=True)  # each insert lands, but its acknowledgement is lost
    hook.failing = True
    writer = _writer(client, insert_hook=hook)
    writer.add(_batch(2), SourceRange("t", 0, 0, 1))
    for _ in range(3):  # the caller retries; each flush tries once
        with pytest.raises(LedgerWriteError, match="do not commit offsets") as info:
            writer.flush()
    err = info.value
    assert (err.transient, err.attempts, err.rows, err.table) == (True, 1, 3, "usage_store")
    assert writer.pending_rows == 3
    assert writer.should_flush()

    # new rows arriving meanwhile go into a later insert, not into the failed one
    writer.add(_batch(1, "late"), SourceRange("t", 0, 2, 2))
    hook.failing = False
    result = writer.flush()
    assert result.rows == {"usage_store": 3, "runs_store": 2}
    assert [r.last_offset for r in result.ranges] == [1, 2]
    tokens = [tok for table, tok, _ in client.inserts if table == "usage_store"]
    # 3 failed attempts + the retry carry one token (ClickHouse keeps one copy), then the late rows
    assert len(tokens) == 5 and len(set(tokens[:4])) == 1
    assert tokens[0].split(":")[3] == "0-1" and tokens[4].split(":")[3] == "2-2"
    assert writer.pending_rows == 0


def test_a_permanent_error_is_not_retried() -> None:
    client = RecordingClient()
    hook = FailingInserts(failures=1, error=lambda: DatabaseError("Cannot parse", code=27))
    writer = _writer(client, insert_hook=hook)
    writer.add(_batch(1), SourceRange("t", 0, 0, 0))
    with pytest.raises(LedgerWriteError) as info:
        writer.flush()
    assert (info.value.transient, info.value.attempts) == (False, 1)
    assert writer.discard() == 2
    assert writer.pending_rows == 0 and not writer.should_flush()


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(LedgerConfigError, match="first_offset 5 > last_offset 4"):
        SourceRange("t", 0, 5, 4)
    with pytest.raises(LedgerConfigError, match="max_rows=0"):
        _writer(RecordingClient(), max_rows=0)


def test_a_row_the_ledger_cannot_store_is_reported_and_kept() -> None:
    client = RecordingClient()
    writer = _writer(client)
    writer.add(LedgerBatch(events=[event_row("a", "r", ts="yesterday")]), SourceRange("t", 0, 0, 0))
    with pytest.raises(LedgerWriteError, match=r"prism\.run_events_store hold a value") as info:
        writer.flush()
    assert info.value.transient is False
    assert writer.pending_rows == 1 and client.inserts == []
