"""``LedgerWriter``: batches ledger rows and inserts them effectively once."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import re
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from operator import attrgetter
from typing import Any

import orjson
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.insert import InsertContext

from prism.schemas import LedgerBatch
from prism.sinks._client import engine_siblings, validate_identifier
from prism.sinks._errors import LedgerConfigError, LedgerWriteError, is_transient
from prism.sinks._tables import STORAGE_TABLES

__all__ = [
    "INSERT_SETTINGS",
    "PARALLEL_INSERTS",
    "FlushResult",
    "InsertHook",
    "LedgerWriter",
    "SourceRange",
]

log = logging.getLogger(__name__)

# Explicit insert settings. async_insert=0: the writer batches by itself, so the server-side
# buffer of async inserts would add latency and buy nothing; with it off, the insert returns
# only once the rows are written to a part, so an acknowledged flush means stored rows and
# the caller may commit its offsets. insert_deduplicate=1 makes a retried insert with the
# same insert_deduplication_token a no-op (within the table's deduplication window).
# wait_for_async_insert=1 is inert with async_insert=0, and stays correct if a server
# profile forces async inserts on: the acknowledgement still waits for the write.
INSERT_SETTINGS: dict[str, Any] = {
    "async_insert": 0,
    "wait_for_async_insert": 1,
    "insert_deduplicate": 1,
    "input_format_native_allow_types_conversion": 1,
}
_LOW_CARDINALITY_RE = re.compile(r"^LowCardinality\((.*)\)$")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS = timedelta(milliseconds=1)

InsertHook = Callable[[str, Callable[[], object]], object]
"""``hook(table, insert)``: must call ``insert()`` to insert; may raise before or after it.
With parallel inserts it is called from several threads at once, one table each."""

_STORED, _UNTRIED = object(), object()  # a chunk's outcome in a flush, beside its error

# Tables a flush inserts at once on a chDB engine, each through a handle of its own (a
# handle runs one query at a time). Most of an insert's time is the engine's, outside the
# interpreter lock: a 1,000-event batch's four to five inserts took 76 ms one after
# another and 44 ms at once, a 5,000-event batch's 122 and 79; in the worker, 27-33% less
# insert time per row (bench/README.md, 2026-12-07 evening).
PARALLEL_INSERTS = 4


@dataclass(frozen=True, slots=True)
class SourceRange:
    """Where a batch came from: a Kafka topic partition and offsets, or a file and line numbers.

    For a file, ``source`` is ``"file:<path>"``, ``partition`` is -1 and the offsets are
    line numbers. Both offsets are inclusive.
    """

    source: str
    partition: int
    first_offset: int
    last_offset: int

    def __post_init__(self) -> None:
        if self.first_offset > self.last_offset:
            raise LedgerConfigError(
                f"source range {self.source}:{self.partition} has first_offset "
                f"{self.first_offset} > last_offset {self.last_offset}; pass them in order"
            )


@dataclass(frozen=True, slots=True)
class FlushResult:
    """What one ``flush()`` stored: rows per storage table, seconds taken, attempts, sources.

    ``ranges`` are the source ranges whose rows are now all stored: their offsets may be
    committed.
    """

    rows: dict[str, int]
    elapsed: float
    attempts: int
    ranges: tuple[SourceRange, ...]

    @property
    def total(self) -> int:
        return sum(self.rows.values())


@dataclass(slots=True)
class _Chunk:
    table: str
    columns: list[list[Any]]
    rows: int
    token: str


@dataclass(slots=True)
class _Cut:
    chunks: list[_Chunk]
    ranges: tuple[SourceRange, ...]


@dataclass(slots=True)
class _Buffer:
    rows: dict[str, list[Any]] = field(default_factory=lambda: {k: [] for k in STORAGE_TABLES})
    ranges: list[SourceRange] = field(default_factory=list)
    count: int = 0
    since: float | None = None


class LedgerWriter:
    """Batches ``LedgerBatch`` rows and inserts them, one INSERT per table per flush.

    Contract:

    - ``add(batch, source)`` only buffers (no I/O). ``source`` is the ``SourceRange`` the
      rows were derived from.
    - ``should_flush()`` is true once ``max_rows`` rows are buffered, once the oldest
      buffered ``add`` is ``max_seconds`` old (a quiet source never holds rows back), or
      while a failed flush awaits its retry. The caller checks it after each ``add`` and on
      a timer.
    - ``flush()`` inserts every non-empty table once (columnar data, one reused insert
      context per table) with ``insert_deduplication_token`` =
      ``"{table}:{source}:{partition}:{first}-{last}:{sha256 of the rows}"``, so a repeated
      insert of the same rows from the same offsets is dropped by ClickHouse, while
      different rows from the same offsets are kept. It tries each insert once: retrying
      is the caller's job (the shell that holds the offsets owns the retry policy). On a
      chDB engine up to ``parallel`` tables are inserted at once, each through a handle
      of its own; a server's client inserts them one after another.
    - When a flush returns, the rows are stored: commit offsets up to ``result.ranges``.
      When it raises ``LedgerWriteError``, nothing of the failed table is known to be
      stored: do not commit (the tables stored meanwhile are not inserted again; of
      several failed tables the error names the first in table order).
      ``error.transient`` says whether trying again may succeed (network, timeouts, too
      many parts); the rows stay in the writer and the next ``flush()`` retries them
      first, with the same tokens (no row is added twice). A permanent error (rows the
      ledger cannot store) will not go away: ``discard()``.

    Not thread-safe: one writer per consumer task.

    Example::

        writer = LedgerWriter(client, "prism", max_rows=50_000, max_seconds=1.0)
        writer.add(output.ledger, SourceRange("prism.agent-events", 0, 100, 199))
        if writer.should_flush():
            result = writer.flush()       # then commit offsets <= 199 of partition 0
    """

    def __init__(
        self,
        client: Client,
        database: str,
        *,
        max_rows: int = 50_000,
        max_seconds: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        insert_hook: InsertHook | None = None,
        parallel: int = PARALLEL_INSERTS,
    ) -> None:
        if max_rows < 1 or max_seconds <= 0 or parallel < 1:
            raise LedgerConfigError(
                f"LedgerWriter needs max_rows >= 1, max_seconds > 0 and parallel >= 1; got "
                f"max_rows={max_rows}, max_seconds={max_seconds}, parallel={parallel}"
            )
        self._client = client
        self._database = validate_identifier(database)
        self.max_rows = max_rows
        self.max_seconds = max_seconds
        self._clock = clock
        self._hook = insert_hook
        self._buffer = _Buffer()
        self._inflight: _Cut | None = None
        self._stored_ranges: list[SourceRange] = []
        self._contexts: dict[tuple[int, str], InsertContext] = {}  # (handle, table) ->
        self.parallel = parallel
        self._handles: list[Client] | None = None  # the client, then its engine's siblings
        self._pool: ThreadPoolExecutor | None = None
        # LedgerBatch attribute -> (table, [(column, holds a datetime)], row -> each value)
        self._tables: dict[str, tuple[str, list[tuple[str, bool]], list[Callable[[Any], Any]]]] = {}
        for name, (table, cls) in STORAGE_TABLES.items():
            fields = dataclasses.fields(cls)
            columns = [(f.name, "datetime" in str(f.type)) for f in fields]
            self._tables[name] = (table, columns, [attrgetter(f.name) for f in fields])

    @property
    def pending_rows(self) -> int:
        """Rows not yet known to be stored (buffered plus a failed flush's rows)."""
        inflight = sum(c.rows for c in self._inflight.chunks) if self._inflight else 0
        return self._buffer.count + inflight

    def add(self, batch: LedgerBatch, *sources: SourceRange) -> None:
        """Buffer ``batch``'s rows, derived from ``sources`` (no I/O)."""
        buf = self._buffer
        for name in STORAGE_TABLES:
            rows = getattr(batch, name)
            if rows:
                buf.rows[name].extend(rows)
                buf.count += len(rows)
        buf.ranges.extend(sources)
        if buf.since is None:
            buf.since = self._clock()

    def should_flush(self) -> bool:
        """True when enough rows are buffered, the oldest is old enough, or a retry is due."""
        buf = self._buffer
        if self._inflight is not None or buf.count >= self.max_rows:
            return True
        return buf.since is not None and self._clock() - buf.since >= self.max_seconds

    def flush(self) -> FlushResult:
        """Insert everything pending; raise ``LedgerWriteError`` if a table keeps failing."""
        started = time.perf_counter()
        rows: dict[str, int] = {}
        attempts = 0
        if self._inflight is not None:
            attempts += self._drain(self._inflight, rows)
        if self._buffer.ranges:
            self._inflight = self._cut()
            attempts += self._drain(self._inflight, rows)
        ranges = tuple(self._stored_ranges)
        self._stored_ranges.clear()
        return FlushResult(rows, time.perf_counter() - started, attempts, ranges)

    def discard(self) -> int:
        """Drop every pending row (the caller abandons them); return how many were dropped."""
        dropped = self.pending_rows
        self._buffer = _Buffer()
        self._inflight = None
        return dropped

    # -- internals -------------------------------------------------------------------

    def _cut(self) -> _Cut:
        """Freeze the buffer into per-table columns and tokens; the buffer starts afresh."""
        buf = self._buffer
        label = _ranges_label(buf.ranges)
        chunks = []
        for name, batch_rows in buf.rows.items():
            if not batch_rows:
                continue
            table, columns, getters = self._tables[name]
            try:
                # a column at a time: zip over a row tuple per row took 1.7x as long
                data = [list(map(getter, batch_rows)) for getter in getters]
                for i, (_, is_time) in enumerate(columns):
                    if is_time:
                        data[i] = _epoch_ms(data[i])
                content = orjson.dumps(data, default=_json_default)
            except (TypeError, AttributeError, ValueError) as exc:
                raise LedgerWriteError(
                    f"rows for {self._database}.{table} hold a value the ledger cannot store "
                    f"({exc}); fix the producer of these rows, or discard() them",
                    table=table,
                    rows=self.pending_rows,
                    attempts=0,
                    transient=False,
                ) from exc
            digest = hashlib.sha256(content).hexdigest()
            chunks.append(_Chunk(table, data, len(batch_rows), f"{table}:{label}:{digest}"))
        self._buffer = _Buffer()
        return _Cut(chunks, tuple(buf.ranges))

    def _drain(self, cut: _Cut, rows: dict[str, int]) -> int:
        """Insert ``cut``'s chunks. A stored one leaves ``cut``, so a retry inserts only
        the rest; a handle stops at its first failure, and the first failed chunk (in
        table order) is raised once every handle has stopped."""
        handles = self._insert_handles(len(cut.chunks))
        n = len(handles)
        if n == 1:
            results = self._try_group(0, cut.chunks)
        else:  # handle k inserts chunks k, k + n, ... one after another
            shares = [cut.chunks[k::n] for k in range(n)]
            groups = list(self._executor().map(self._try_group, range(n), shares))
            results = [groups[i % n][i // n] for i in range(len(cut.chunks))]
        kept, failed = [], []
        for chunk, result in zip(cut.chunks, results, strict=True):
            if result is _STORED:
                rows[chunk.table] = rows.get(chunk.table, 0) + chunk.rows
                continue
            kept.append(chunk)
            if isinstance(result, Exception):
                failed.append((chunk, result))
        tried = sum(result is not _UNTRIED for result in results)
        cut.chunks[:] = kept
        if failed:
            chunk, exc = failed[0]
            raise self._failure(chunk, exc, cut) from exc
        self._stored_ranges.extend(cut.ranges)
        self._inflight = None
        return tried

    def _try_group(self, handle: int, chunks: list[_Chunk]) -> list[object]:
        """Each of ``chunks`` through handle ``handle`` in turn, until one fails: per chunk
        ``_STORED``, its error, or ``_UNTRIED`` after a failure."""
        results: list[object] = []
        for chunk in chunks:
            error = self._try_insert(handle, chunk)
            results.append(_STORED if error is None else error)
            if error is not None:
                break
        return results + [_UNTRIED] * (len(chunks) - len(results))

    def _try_insert(self, handle: int, chunk: _Chunk) -> Exception | None:
        """Insert ``chunk`` through handle ``handle``; its error, or None once stored."""
        context = self._context(chunk.table, handle)
        context.settings["insert_deduplication_token"] = chunk.token
        context.data = chunk.columns
        client = self._handles[handle] if self._handles else self._client

        def insert(context: InsertContext = context) -> object:
            return client.insert(context=context)

        try:
            if self._hook is None:
                insert()
            else:
                self._hook(chunk.table, insert)
        except Exception as exc:
            return exc
        finally:
            context.data = None
        return None

    def _failure(self, chunk: _Chunk, exc: Exception, cut: _Cut) -> LedgerWriteError:
        transient = is_transient(exc)
        pending = sum(c.rows for c in cut.chunks) + self._buffer.count
        kind = "transient" if transient else "permanent"
        return LedgerWriteError(
            f"insert of {chunk.rows} rows into {self._database}.{chunk.table} failed "
            f"({kind} error: {exc}); {pending} rows stay pending: do not commit offsets"
            + (", flush() again later" if transient else ", discard() them"),
            table=chunk.table,
            rows=pending,
            attempts=1,
            transient=transient,
        )

    def _insert_handles(self, chunks: int) -> list[Client]:
        """The handles a flush of ``chunks`` tables inserts through: the client alone on a
        server or for one table, else up to ``parallel`` handles on its chDB engine."""
        if self._handles is None:
            self._handles = [self._client]
            if self.parallel > 1:
                self._handles += engine_siblings(self._client, self.parallel - 1)
        return self._handles[: max(1, min(chunks, len(self._handles)))]

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.parallel, thread_name_prefix="ledger-insert")
            weakref.finalize(self, self._pool.shutdown, wait=False)
        return self._pool

    def _context(self, table: str, handle: int = 0) -> InsertContext:
        context = self._contexts.get((handle, table))
        if context is not None:
            return context
        if handle:  # a sibling handle: the same columns and types as the client's
            base = self._context(table)
            assert self._handles is not None
            context = self._handles[handle].create_insert_context(
                table,
                column_names=list(base.column_names),
                database=self._database,
                column_type_names=[t.name for t in base.column_types],
                column_oriented=True,
                settings=dict(INSERT_SETTINGS),
            )
            self._contexts[handle, table] = context
            return context
        columns = [c for t, cols, _ in self._tables.values() if t == table for c, _ in cols]
        result = self._client.query(
            "SELECT name, type FROM system.columns "
            "WHERE database = {db:String} AND table = {table:String}",
            parameters={"db": self._database, "table": table},
        )
        types = {str(n): str(t) for n, t in result.result_rows}
        missing = [c for c in columns if c not in types]
        if missing:
            raise LedgerConfigError(
                f"table {self._database}.{table} lacks columns {missing} (or does not "
                "exist); run `prism-pipeline migrate` against this ledger first"
            )
        context = self._client.create_insert_context(
            table,
            column_names=columns,
            database=self._database,
            # LowCardinality columns travel as their plain type and the server converts
            # them (input_format_native_allow_types_conversion): the client-side
            # dictionary encoding costs more than it saves.
            column_type_names=[_LOW_CARDINALITY_RE.sub(r"\1", types[c]) for c in columns],
            column_oriented=True,
            settings=dict(INSERT_SETTINGS),
        )
        self._contexts[handle, table] = context
        return context


def _ranges_label(ranges: Sequence[SourceRange]) -> str:
    """``source:partition:first-last`` per (source, partition), merged, comma-separated."""
    merged: dict[tuple[str, int], tuple[int, int]] = {}
    for r in ranges:
        key = (r.source, r.partition)
        lo, hi = merged.get(key, (r.first_offset, r.last_offset))
        merged[key] = (min(lo, r.first_offset), max(hi, r.last_offset))
    return ",".join(f"{s}:{p}:{lo}-{hi}" for (s, p), (lo, hi) in sorted(merged.items()))


def _epoch_ms(values: list[Any]) -> list[int | None]:
    """DateTime64(3) ticks (milliseconds since the epoch, floored); naive values are UTC.

    A value that is the same object as the one before it takes its ticks: a batch's rows
    share its arrival time's datetime (the core caches them, ``from_us``), which then
    costs an identity test (20 ns) instead of a subtraction and a division (200 ns)."""
    try:
        out: list[int | None] = []
        last: Any = out  # no value is this list
        ms: int | None = None
        for v in values:
            if v is not last:
                last, ms = v, None if v is None else (v - _EPOCH) // _ONE_MS
            out.append(ms)
        return out
    except TypeError:  # naive datetimes among them
        return [
            None if v is None else (v.replace(tzinfo=v.tzinfo or UTC) - _EPOCH) // _ONE_MS
            for v in values
        ]


def _json_default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    raise TypeError(f"cannot hash a {type(value).__name__} ledger value: {value!r}")
