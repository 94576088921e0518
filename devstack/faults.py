"""Test-only fault injection at the ledger writer's seams, through ``WorkerHooks``.

The fault-injection suite (``tests/integration/test_faults*.py``) starts workers with
``python -m prism.devstack.faults SPEC [worker options]``: the same worker as
``prism-pipeline worker``, built with this plan's hooks, so it dies or fails at exact
points of a ledger flush. Production code never reads a fault spec: the worker only gets
hooks that its caller passes.

Spec: comma-separated faults, each kind at most once. Flushes are numbered from 1 in the
order the worker calls ``LedgerWriter.flush()`` (a retried flush counts again).

- ``kill_after_insert:N``: SIGKILL the process once the first flush numbered >= N that
  stored rows has inserted every table, before ``flush()`` returns: the rows are in the
  ledger, the offsets they came from are not committed.
- ``kill_mid_insert:N``: SIGKILL the process once one table of the first flush
  numbered >= N that inserts two tables or more is stored and another is not: before
  the second table's insert when they go one after another, or as the first table's
  insert returns while others are in flight (a chDB ledger inserts tables at once).
- ``fail_inserts:N`` or ``fail_inserts:Ts``: every insert raises a transient
  ``ConnectionError`` (nothing is inserted) for N insert calls, or for T seconds from the
  first failing call. ``@M`` (``fail_inserts:10s@3``) starts failing at flush M.

- ``refuse_event:ID``: the ledger refuses, as a permanent error, every flush holding a row
  of the event ``ID`` (a poison record: the worker must isolate it and carry on).
- ``drop_fetch:N``: the worker drops the N-th chunk of records it fetches from an input
  topic (counted from 1) before stepping it: the consumer's position has moved past
  them, and nothing fetches them again unless the worker notices.
- ``stall_after_insert:N``: once the first flush numbered >= N that stored rows has
  inserted them, hold the flush for ``STALL_SECONDS`` before it returns: a worker caught
  between its ledger insert and its Kafka transaction, which a test can pause (SIGSTOP)
  past its session timeout to make it a zombie.

Each fault writes one ``prism-fault: ...`` line to stderr when it fires (failures: the
first one and the recovery), so a test can check the fault hit where it should.

Exceptions: ``FaultSpecError`` (``ValueError``), a malformed spec.

Example::

    python -m prism.devstack.faults kill_after_insert:3 --group g1
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "MARKER",
    "SPEC_NAME",
    "STALL_SECONDS",
    "FaultPlan",
    "FaultSpecError",
    "FaultyWriter",
    "main",
    "parse_faults",
]

log = logging.getLogger("prism.faults")

SPEC_NAME = "fault spec"
MARKER = "prism-fault:"
STALL_SECONDS = 8.0  # how long stall_after_insert holds its flush

_REFUSE_RE = re.compile(r"^refuse_event:(?P<event_id>[^,\s]{1,128})$")
_ITEM_RE = re.compile(
    r"^(?P<kind>kill_after_insert|kill_mid_insert|fail_inserts|drop_fetch|stall_after_insert)"
    r":(?P<amount>\d+(?:\.\d+)?)(?P<unit>s?)(?:@(?P<start>\d+))?$"
)


class FaultSpecError(ValueError):
    """A fault spec does not parse; the message names the bad item and the grammar."""


def _kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _say(message: str) -> None:
    # Unbuffered, so the line reaches the log even though SIGKILL follows at once.
    os.write(2, f"{MARKER} {message}\n".encode())


@dataclass
class FaultPlan:
    """The faults to inject and their progress; ``insert_hook`` and ``wrap`` install them.

    ``kill`` and ``clock`` are replaceable for unit tests.
    """

    kill_after_insert: int | None = None
    kill_mid_insert: int | None = None
    fail_calls: int | None = None
    fail_seconds: float | None = None
    fail_from_flush: int = 1
    refuse_event: str | None = None
    drop_fetch: int | None = None
    stall_after_insert: int | None = None
    kill: Callable[[], None] = _kill_self
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    flushes: int = field(default=0, init=False)
    failed: int = field(default=0, init=False)
    fetched: int = field(default=0, init=False)
    _tables_this_flush: list[str] = field(default_factory=list, init=False)  # stored
    _started_this_flush: list[str] = field(default_factory=list, init=False)
    _fail_since: float | None = field(default=None, init=False)
    _recovered: bool = field(default=False, init=False)

    def wrap(self, writer: Any) -> FaultyWriter:
        """``writer`` with flushes counted (and killed after, if asked)."""
        return FaultyWriter(writer, self)

    def insert_hook(self, table: str, insert: Callable[[], object]) -> object:
        """The ``LedgerWriter`` insert hook: fail, or kill in the middle of a flush (before
        the second table's insert, or as the first returns while another is in flight).
        Called from several threads at once when the writer inserts tables in parallel."""
        if self._failing():
            self.failed += 1
            if self.failed == 1:
                _say(f"fail_inserts: insert into {table} fails (flush {self.flushes})")
            raise ConnectionError(
                f"injected insert failure #{self.failed} into {table} (fail_inserts)"
            )
        if self._mid_insert() and len(self._tables_this_flush) == 1:
            _say(
                f"kill_mid_insert: flush {self.flushes} inserted {self._tables_this_flush[0]}, "
                f"SIGKILL before {table}"
            )
            self.kill()
        self._started_this_flush.append(table)
        result = insert()
        self._tables_this_flush.append(table)
        others = [t for t in self._started_this_flush if t not in self._tables_this_flush]
        if self._mid_insert() and len(self._tables_this_flush) == 1 and others:
            _say(
                f"kill_mid_insert: flush {self.flushes} inserted {table}, SIGKILL with "
                f"{', '.join(others)} in flight"
            )
            self.kill()
        return result

    def _mid_insert(self) -> bool:
        return self.kill_mid_insert is not None and self.flushes >= self.kill_mid_insert

    def fetch_hook(self, topic: str, partition: int, records: list[Any]) -> bool:
        """The worker's ``drop_fetched`` seam: True for the ``drop_fetch``-th chunk."""
        self.fetched += 1
        if self.fetched != self.drop_fetch:
            return False
        _say(
            f"drop_fetch: chunk {self.fetched} ({topic}[{partition}] offsets "
            f"{records[0].offset}..{records[-1].offset}) dropped"
        )
        return True

    def flush_started(self) -> None:
        """A new flush begins (numbered from 1)."""
        self.flushes += 1
        self._tables_this_flush = []
        self._started_this_flush = []

    def flush_finished(self, result: Any) -> None:
        """Kill (or stall) after the flush stored its rows, before the caller sees ``result``."""
        stored = getattr(result, "rows", None) or {}
        if (
            self.stall_after_insert is not None
            and self.flushes >= self.stall_after_insert
            and sum(stored.values()) > 0
        ):
            self.stall_after_insert = None  # once
            _say(f"stall_after_insert: flush {self.flushes} stored {dict(stored)}; "
                 f"holding it {STALL_SECONDS:g}s before its commit")  # fmt: skip
            self.sleep(STALL_SECONDS)
        if (
            self.kill_after_insert is not None
            and self.flushes >= self.kill_after_insert
            and sum(stored.values()) > 0
        ):
            ranges = ",".join(
                f"{r.source}:{r.partition}:{r.first_offset}-{r.last_offset}"
                for r in getattr(result, "ranges", ())
            )
            _say(
                f"kill_after_insert: flush {self.flushes} stored {dict(stored)} "
                f"ranges={ranges}; SIGKILL before flush() returns"
            )
            self.kill()

    def _failing(self) -> bool:
        if self._recovered or (self.fail_calls is None and self.fail_seconds is None):
            return False
        if self.flushes < self.fail_from_flush:
            return False
        if self._fail_since is None:
            self._fail_since = self.clock()
        if self.fail_calls is not None:
            over = self.failed >= self.fail_calls
        else:
            assert self.fail_seconds is not None
            over = self.clock() - self._fail_since >= self.fail_seconds
        if over:
            self._recovered = True
            _say(f"fail_inserts: over at flush {self.flushes} after {self.failed} failed inserts")
        return not over


class FaultyWriter:
    """A ``LedgerWriter`` stand-in telling its ``FaultPlan`` where each flush begins and ends."""

    def __init__(self, writer: Any, plan: FaultPlan) -> None:
        self._writer = writer
        self._plan = plan
        self._poisoned = False

    def add(self, batch: Any, *sources: Any) -> None:
        poison = self._plan.refuse_event
        if poison is not None and any(
            getattr(row, "event_id", None) == poison
            for rows in (batch.events, batch.usage)
            for row in rows
        ):
            self._poisoned = True
        self._writer.add(batch, *sources)

    def flush(self) -> Any:
        if self._poisoned:
            from prism.sinks import LedgerWriteError

            self._poisoned = False
            _say(f"refuse_event: a flush holds a row of {self._plan.refuse_event}; refused")
            raise LedgerWriteError(
                f"injected permanent refusal of event {self._plan.refuse_event} (refuse_event)",
                table="run_events_store", rows=0, attempts=1, transient=False,
            )  # fmt: skip
        self._plan.flush_started()
        result = self._writer.flush()
        self._plan.flush_finished(result)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._writer, name)


def parse_faults(spec: str) -> FaultPlan | None:
    """The plan for a fault spec; ``None`` for an empty one.

    Example::

        parse_faults("fail_inserts:10s@2")   # fail every insert for 10 s from flush 2
    """
    plan = FaultPlan()
    seen: set[str] = set()
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        refuse = _REFUSE_RE.match(item)
        if refuse is not None:
            if "refuse_event" in seen:
                raise FaultSpecError(f"{SPEC_NAME} names refuse_event twice in {spec!r}")
            seen.add("refuse_event")
            plan.refuse_event = refuse["event_id"]
            continue
        m = _ITEM_RE.match(item)
        if m is None:
            raise FaultSpecError(
                f"{SPEC_NAME} item {item!r} is not understood; use kill_after_insert:N, "
                "kill_mid_insert:N, fail_inserts:N or fail_inserts:Ts, optionally with "
                "@M on fail_inserts (e.g. fail_inserts:10s@2), drop_fetch:N, "
                "stall_after_insert:N, or "
                "refuse_event:ID, comma-separated"
            )
        kind, amount, seconds, start = m["kind"], m["amount"], m["unit"] == "s", m["start"]
        if kind in seen:
            raise FaultSpecError(f"{SPEC_NAME} names {kind} twice in {spec!r}; give it once")
        seen.add(kind)
        if (seconds or start) and kind != "fail_inserts":
            raise FaultSpecError(
                f"{SPEC_NAME} item {item!r}: only fail_inserts takes seconds or @M; "
                f"{kind} takes a {'chunk' if kind == 'drop_fetch' else 'flush'} number, "
                f"e.g. {kind}:3"
            )
        if not seconds and "." in amount:
            raise FaultSpecError(f"{SPEC_NAME} item {item!r}: a count must be a whole number")
        if kind == "fail_inserts":
            if seconds:
                plan.fail_seconds = float(amount)
            else:
                plan.fail_calls = int(amount)
            plan.fail_from_flush = int(start) if start else 1
        elif kind == "kill_after_insert":
            plan.kill_after_insert = int(amount)
        elif kind == "drop_fetch":
            plan.drop_fetch = int(amount)
        elif kind == "stall_after_insert":
            plan.stall_after_insert = int(amount)
        else:
            plan.kill_mid_insert = int(amount)
        if float(amount) <= 0 or plan.fail_from_flush < 1:
            raise FaultSpecError(f"{SPEC_NAME} item {item!r}: numbers must be >= 1 (or > 0 s)")
    return plan if seen else None


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m prism.devstack.faults SPEC [worker options]``: a worker with these faults."""
    from prism.pipeline.commands.worker import overrides, register
    from prism.pipeline.settings import load_settings
    from prism.pipeline.worker import WorkerHooks, run_worker

    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        raise SystemExit("usage: python -m prism.devstack.faults SPEC [worker options]")
    spec, worker_args = args[0], args[1:]
    parser = argparse.ArgumentParser(prog="python -m prism.devstack.faults")
    parser.add_argument("-v", "--verbose", action="store_true")
    register(parser.add_subparsers())
    options = parser.parse_args(["worker", *worker_args])
    plan = parse_faults(spec)
    hooks = WorkerHooks()
    if plan is not None:
        log.warning("test-only fault injection is active: %s", spec)
        hooks = WorkerHooks(
            insert_hook=plan.insert_hook,
            wrap_writer=plan.wrap,
            drop_fetched=plan.fetch_hook if plan.drop_fetch is not None else None,
        )
    level = logging.DEBUG if options.verbose else logging.INFO
    return run_worker(load_settings(**overrides(options)), loglevel=level, hooks=hooks)


if __name__ == "__main__":
    raise SystemExit(main())
