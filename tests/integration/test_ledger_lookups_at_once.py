"""A run's timeline reads its four lookups at once on chDB's other handles (engine_siblings)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from prism.schemas import LedgerBatch
from prism.sinks import LedgerWriter, SourceRange, migrate, run_timeline
from prism.sinks._client import chdb_path, engine_siblings
from prism.sinks._errors import LedgerQueryError
from prism.sinks.testing import event_row, run_row, turn_row, usage_row

pytestmark = pytest.mark.integration


class _OneByOne:
    """The same engine behind an object that is not a chDB client: lookups run in turn."""

    def __init__(self, client: Any) -> None:
        self.query = client.query


@pytest.fixture
def ledger(ch_client: Any, ch_database: str) -> str:
    migrate(ch_client, ch_database)
    batch = LedgerBatch(
        runs=[run_row(f"r{n}", status="completed", version=2) for n in range(5)],
        turns=[turn_row(f"r{n}", t, seq=2 * t) for n in range(5) for t in (1, 2, 3)],
        usage=[
            usage_row(f"u{n}-{t}", f"r{n}", seq=2 * t + 1, turn=t)
            for n in range(5)
            for t in (1, 2, 3)
        ],
        events=[event_row(f"e{n}-{s}", f"r{n}", s) for n in range(5) for s in range(8)],
    )
    writer = LedgerWriter(ch_client, ch_database)
    writer.add(batch, SourceRange("prism.agent-events", 0, 0, len(batch)))
    writer.flush()
    return ch_database


def test_lookups_at_once_return_what_lookups_in_turn_return(ch_client: Any, ledger: str) -> None:
    assert chdb_path(ch_client) is not None and chdb_path(_OneByOne(ch_client)) is None
    for run_id in ("r0", "r3", "absent"):
        at_once = run_timeline(ch_client, ledger, run_id)
        assert at_once == run_timeline(_OneByOne(ch_client), ledger, run_id)
    full = run_timeline(ch_client, ledger, "r3")
    assert full["run"]["run_id"] == "r3"
    assert [t["turn"] for t in full["turns"]] == [1, 2, 3]
    assert [u["event_id"] for u in full["usage"]] == ["u3-1", "u3-2", "u3-3"]
    assert [e["seq"] for e in full["events"]] == list(range(8))


def test_the_extra_handles_are_opened_once_per_client(ch_client: Any, ledger: str) -> None:
    run_timeline(ch_client, ledger, "r1")
    others = engine_siblings(ch_client, 3)
    assert len(others) == 3 and len({id(c) for c in [ch_client, *others]}) == 4
    assert all(chdb_path(c) == chdb_path(ch_client) for c in others)
    run_timeline(ch_client, ledger, "r2")
    assert engine_siblings(ch_client, 3) == others  # the same handles, not new ones


def test_timelines_from_several_threads_share_the_handles(ch_client: Any, ledger: str) -> None:
    from concurrent.futures import ThreadPoolExecutor

    runs = [f"r{n % 5}" for n in range(40)]
    expected = {r: run_timeline(_OneByOne(ch_client), ledger, r) for r in set(runs)}
    with ThreadPoolExecutor(4) as threads:
        got = list(threads.map(lambda r: run_timeline(ch_client, ledger, r), runs))
    assert got == [expected[r] for r in runs]


def test_a_failed_lookup_is_a_query_error_and_the_handles_still_serve(
    ch_client: Any, ledger: str
) -> None:
    with pytest.raises(LedgerQueryError, match="query failed"):
        run_timeline(ch_client, "t_no_such_ledger", "r1")
    assert run_timeline(ch_client, ledger, "r4")["run"]["run_id"] == "r4"


# chDB hosts one engine per process, so this runs in a process of its own: the first
# engine's extra handles must not keep it open once its client is closed.
_REOPEN = """
import sys
from prism.sinks import connect, migrate, run_timeline
first = connect(f"chdb://{sys.argv[1]}/first", "prism")
migrate(first, "prism")
assert run_timeline(first, "prism", "r1")["run"] is None
first.close()
second = connect(f"chdb://{sys.argv[1]}/second", "prism")
migrate(second, "prism")
print(second.query("SELECT count() FROM prism.runs_store").result_rows[0][0])
"""


def _python(script: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


def test_a_closed_clients_handles_let_the_process_open_another_engine(tmp_path: Path) -> None:
    assert _python(_REOPEN, str(tmp_path)) == "0"


# The same in-memory engine behind every handle: the other handles see the caller's rows.
_IN_MEMORY = """
from prism.schemas import LedgerBatch
from prism.sinks import LedgerWriter, SourceRange, connect, migrate, run_timeline
from prism.sinks._client import engine_siblings
from prism.sinks.testing import event_row, run_row, turn_row, usage_row
client = connect("chdb://:memory:", "prism")
migrate(client, "prism")
batch = LedgerBatch(runs=[run_row("r1")], turns=[turn_row("r1", 1, seq=2)],
                    usage=[usage_row("u1", "r1", seq=3)], events=[event_row("e0", "r1", 0)])
writer = LedgerWriter(client, "prism")
writer.add(batch, SourceRange("t", 0, 0, 1))
writer.flush()
timeline = run_timeline(client, "prism", "r1")
assert len(engine_siblings(client, 3)) == 3
print(timeline["run"]["run_id"], len(timeline["turns"]), len(timeline["usage"]),
      len(timeline["events"]))
"""


def test_an_in_memory_engine_reads_at_once_too() -> None:
    assert _python(_IN_MEMORY) == "r1 1 1 1"


def test_an_engine_that_refuses_another_handle_still_gives_the_timeline(
    ch_client: Any, ledger: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import clickhouse_connect

    from prism.sinks import _client

    def refuse(**_: Any) -> Any:
        raise RuntimeError("no more handles")

    expected = run_timeline(_OneByOne(ch_client), ledger, "r2")
    monkeypatch.setattr(_client, "_siblings", _client.weakref.WeakKeyDictionary())
    monkeypatch.setattr(clickhouse_connect, "get_client", refuse)
    monkeypatch.setattr("prism.sinks._queries._handles_refused", False)
    with caplog.at_level("WARNING", logger="prism.sinks._queries"):
        assert run_timeline(ch_client, ledger, "r2") == expected
        assert run_timeline(ch_client, ledger, "r2") == expected
    refused = [r for r in caplog.records if "one by one" in r.getMessage()]
    assert len(refused) == 1 and "no more handles" in refused[0].getMessage()


# A writer's parallel inserts open handles beside its client; close_client closes them too,
# so the engine stops and the process may open another (or remove the folder).
_CLOSE = """
import shutil, sys
from prism.schemas import LedgerBatch
from prism.sinks import LedgerWriter, SourceRange, close_client, connect, migrate
from prism.sinks._client import chdb_handle, engine_siblings
from prism.sinks.testing import event_row, run_row, turn_row, usage_row
client = connect(f"chdb://{sys.argv[1]}/first", "prism")
migrate(client, "prism")
writer = LedgerWriter(client, "prism")
writer.add(LedgerBatch(runs=[run_row("r1")], turns=[turn_row("r1", 1)],
                       usage=[usage_row("u1", "r1")], events=[event_row("e0", "r1", 0)]),
           SourceRange("t", 0, 0, 1))
writer.flush()
handles = engine_siblings(client, 3)
assert len(handles) == 3
close_client(client)
assert not any(h.ping() for h in [client, *handles])
shutil.rmtree(f"{sys.argv[1]}/first")
other = chdb_handle(f"{sys.argv[1]}/second")
print(other.query("SELECT 1").result_rows[0][0])
"""


def test_closing_a_client_closes_the_handles_its_writer_opened(tmp_path: Path) -> None:
    assert _python(_CLOSE, str(tmp_path)) == "1"
