"""The shells' one owner of ledger writes: insert and wait, retry what is transient.

``LedgerStore`` is the ``store`` that ``core.store_isolating`` calls. It adds an output's
rows to the ``LedgerWriter`` and flushes: the writer tries once and says whether an
error is transient. A transient error (network, timeout, too many parts) is retried
here with exponential backoff, forever for the worker (its offsets wait meanwhile) or up
to a deadline for a file or a rebuild; a permanent one (the ledger cannot store these
rows) becomes ``PermanentStoreError``, so the core isolates the poison records.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Protocol

from clickhouse_connect.driver.client import Client

from prism import sinks
from prism.schemas import LedgerBatch
from prism.sinks import LedgerWriteError, SourceRange

from .core import Output, PermanentStoreError
from .settings import Settings

__all__ = ["LedgerSink", "LedgerStore", "LedgerUnavailable", "open_ledger"]

log = logging.getLogger("prism.ledger")


def open_ledger(settings: Settings, database: str | None = None) -> Client:
    """Connect to the configured ledger and apply its migrations (every shell starts so)."""
    database = database or settings.clickhouse_database
    client = sinks.connect(settings.clickhouse_dsn, database)
    sinks.migrate(
        client,
        database,
        cluster=settings.clickhouse_cluster,
        raw_event_ttl_days=settings.raw_event_ttl_days,
    )
    return client


class LedgerSink(Protocol):
    """What a shell needs of the ledger writer (``sinks.LedgerWriter`` fits)."""

    def add(self, batch: LedgerBatch, *sources: SourceRange) -> None: ...

    def flush(self) -> object: ...

    def discard(self) -> int: ...


class LedgerUnavailable(RuntimeError):
    """Transient ledger errors outlasted the deadline; nothing was committed."""


class LedgerStore:
    """Insert an ``Output``'s rows and wait for the acknowledgement; own the retries.

    ``give_up_after``: seconds of transient failures before ``LedgerUnavailable`` (None:
    never, the worker's choice). ``stopping``: polled between attempts; when it turns
    true the store raises ``LedgerUnavailable`` so a stopping worker does not hang.
    """

    def __init__(
        self,
        writer: LedgerSink,
        *,
        give_up_after: float | None = 60.0,
        backoff: float = 0.2,
        max_backoff: float = 10.0,
        stopping: Callable[[], bool] = lambda: False,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        stats: Counter[str] | None = None,
    ) -> None:
        self.writer = writer
        self.give_up_after = give_up_after
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.stopping = stopping
        self._sleep = sleep
        self._clock = clock
        self.stats: Counter[str] = stats if stats is not None else Counter()

    def __call__(self, out: Output) -> None:
        """Store ``out``'s rows (nothing to do when it has none)."""
        if not len(out.ledger):
            return
        self.writer.add(out.ledger, *(SourceRange(*r) for r in out.ranges))
        self.flush()

    def flush(self) -> None:
        """Flush the writer: retry transient errors, raise ``PermanentStoreError`` otherwise."""
        started = self._clock()
        delay = self.backoff
        while True:
            try:
                self.writer.flush()
                return
            except LedgerWriteError as exc:
                if not exc.transient:
                    self.writer.discard()
                    self.stats["ledger_permanent_errors"] += 1
                    raise PermanentStoreError(str(exc)) from exc
                self.stats["ledger_transient_errors"] += 1
                waited = self._clock() - started
                if self.stopping() or (
                    self.give_up_after is not None and waited >= self.give_up_after
                ):
                    raise LedgerUnavailable(
                        f"the ledger kept failing for {waited:.0f}s; nothing was committed "
                        f"(last error: {exc})"
                    ) from exc
                log.warning("ledger write failed, offsets held, retrying in %.1fs: %s", delay, exc)
                self._sleep(delay)
                delay = min(delay * 2, self.max_backoff)
