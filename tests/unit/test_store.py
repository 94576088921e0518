"""``LedgerStore``: the shells' one owner of ledger retries (transient) and refusals (permanent)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from clickhouse_connect.driver.exceptions import DatabaseError

from prism.pipeline._store import LedgerStore, LedgerUnavailable
from prism.pipeline.core import Output, PermanentStoreError
from prism.schemas import LedgerBatch
from prism.sinks import STORAGE_TABLES, LedgerWriter
from prism.sinks._tables import columns_of
from prism.sinks.testing import FailingInserts, usage_row


class Client:
    def __init__(self) -> None:
        self.inserts: list[str] = []

    def query(self, sql: str, parameters: dict[str, str]) -> Any:
        cls = next(c for t, c in STORAGE_TABLES.values() if t == parameters["table"])
        return SimpleNamespace(result_rows=[(c, "String") for c in columns_of(cls)])

    def create_insert_context(self, table: str, **kw: Any) -> Any:
        return SimpleNamespace(table=table, data=None, **kw)

    def insert(self, context: Any) -> None:
        self.inserts.append(context.settings["insert_deduplication_token"])


def _out(event_id: str = "e1") -> Output:
    out = Output(ledger=LedgerBatch(usage=[usage_row(event_id, "r1")]))
    out.ranges.append(("prism.agent-events", 0, 4, 4))
    return out


def test_transient_failures_are_retried_with_backoff_and_counted() -> None:
    client, sleeps = Client(), []
    writer = LedgerWriter(client, "prism", insert_hook=FailingInserts(failures=3))  # type: ignore[arg-type]
    store = LedgerStore(writer, backoff=0.5, max_backoff=1.5, sleep=sleeps.append)
    store(_out())
    assert sleeps == [0.5, 1.0, 1.5]
    assert store.stats["ledger_transient_errors"] == 3
    assert len(client.inserts) == 1 and client.inserts[0].startswith("usage_store:prism")


def test_a_permanent_error_becomes_a_refusal_and_drops_the_rows() -> None:
    hook = FailingInserts(failures=1, error=lambda: DatabaseError("Cannot parse", code=27))
    writer = LedgerWriter(Client(), "prism", insert_hook=hook)  # type: ignore[arg-type]
    store = LedgerStore(writer, sleep=lambda s: pytest.fail("a permanent error is not retried"))
    with pytest.raises(PermanentStoreError, match="permanent error"):
        store(_out())
    assert writer.pending_rows == 0 and store.stats["ledger_permanent_errors"] == 1


def test_a_deadline_ends_the_retries_of_a_file_replay_with_one_clear_error() -> None:
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    writer = LedgerWriter(Client(), "prism", insert_hook=FailingInserts(failures=10**6))  # type: ignore[arg-type]
    store = LedgerStore(writer, give_up_after=30, sleep=sleep, clock=lambda: now[0])
    with pytest.raises(LedgerUnavailable, match=r"kept failing for 3[0-9]s; nothing was committed"):
        store(_out())


def test_a_stopping_worker_stops_retrying() -> None:
    writer = LedgerWriter(Client(), "prism", insert_hook=FailingInserts(failures=10**6))  # type: ignore[arg-type]
    calls = []
    store = LedgerStore(
        writer, give_up_after=None, stopping=lambda: len(calls) >= 2, sleep=calls.append
    )
    with pytest.raises(LedgerUnavailable):
        store(_out())
    assert len(calls) == 2


def test_an_output_without_rows_stores_nothing() -> None:
    client = Client()
    LedgerStore(LedgerWriter(client, "prism"))(Output())  # type: ignore[arg-type]
    assert client.inserts == []
