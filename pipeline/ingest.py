"""The file replayer: JSONL envelopes -> the shared intake step -> the same ledger, no Kafka.

A file may mix agent events and channel-operation records: the intake dispatches on each
line's ``schema``.

For backfills, debugging and reproducible results. Lines go through ``core.Intake`` like
Kafka records do (a line number is the offset, partition -1); malformed lines become
dead-letter rows with their line number. As in the worker, batches are of 20,000 lines
by default, and the next batch's lines are parsed in a thread of their own while this
batch's rows are inserted (``Intake.parse_ahead``): the file is read one batch ahead, so
at most two batches of lines are in hand. ``ingest-file`` also keeps the collector as the
worker does (``gc_policy``: none inside a batch, the survivors frozen, a full pass once a
minute), which took a 100k-line replay from about 10 s to about 6 s here. At the end
every run whose terminal arrived is closed (gaps recorded) and the stale rule runs on the
event-time watermark. Grace is judged on event time only, so the same input gives the same
ledger apart from its processing columns (``received_at``, versions).

With a ``StateTable`` the core's state is loaded before and saved after each stored batch,
in the ledger database itself: a backfill split into any number of files or invocations
equals one file.

Example::

    summary = ingest_lines(open("fleet.jsonl", "rb"), source="file:fleet.jsonl",
                           store=LedgerStore(writer), state=StateTable(client, "prism"))
    print(summary.render())
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Protocol

from prism.schemas import MAX_EVENT_BYTES, LedgerBatch
from prism.sinks import StateTable

from .core import CoreConfig, ExhaustionAlerter, InRecord, Intake, Output, store_isolating
from .settings import Settings
from .worker._gc import GcPolicy

__all__ = [
    "IngestSummary",
    "LedgerTally",
    "ingest_lines",
    "iter_lines",
    "open_input",
    "render_counts",
]

FILE_PARTITION = -1
_ALERTER_KEY = "a\x1falerter"
BATCH_SIZE: int = Settings.model_fields["batch_max_events"].default  # the worker's batch
# As the worker parses ahead (``worker._app``): values per slice, and the pause after each
# slice that hands the GIL back to the store's thread as soon as an INSERT returns.
_PARSE_AHEAD_SLICE = 128
_PARSE_AHEAD_PAUSE = 0.0001  # seconds

log = logging.getLogger("prism.ingest")


def render_counts(counts: Counter[str], prefix: str) -> str:
    """``reason=n, ...`` for the stats under ``prefix.`` (or ``none``)."""
    picked = {k.split(".", 1)[1]: v for k, v in counts.items() if k.startswith(prefix + ".")}
    return ", ".join(f"{k}={v}" for k, v in sorted(picked.items())) or "none"


@dataclass(slots=True)
class IngestSummary:
    """Counts a user checks after a replay: what the ledger holds of it at the end.

    Runs by status, events applied, quarantine by reason, alerts and the channel counts
    are read from the rows as the ledger keeps them (per key the highest version, a tie
    to the later row; retracted rows left out), never summed over the batches that wrote
    them: an event applied and then retracted, or a run written again at a lower version
    than the row the ledger keeps, counts as the ledger has it, whatever the batch size
    (rule 10). Events applied are the accepted events of the runs the replay wrote (of a
    backfill continued over invocations, those of the runs' earlier lines too).
    """

    lines: int = 0
    stats: Counter[str] = field(default_factory=Counter)
    runs_by_status: dict[str, int] = field(default_factory=dict)
    alerts: int = 0
    # values whose parse a step took from the parse ahead: how the replay ran, not what the
    # ledger holds, so it is not rendered
    parsed_ahead: int = 0

    @property
    def dlq(self) -> Counter[str]:
        return Counter({k[4:]: v for k, v in self.stats.items() if k.startswith("dlq.")})

    def render(self) -> str:
        statuses = ", ".join(f"{k}={v}" for k, v in sorted(self.runs_by_status.items()))
        return "\n".join(
            [
                f"lines read:      {self.lines}",
                f"events applied:  {self.stats['applied']}",
                f"duplicates:      {self.stats['duplicate']}",
                f"runs by status:  {statuses or 'none'}",
                f"dead letters:    {render_counts(self.stats, 'dlq')}",
                f"quarantined:     {render_counts(self.stats, 'quarantine')}",
                f"alerts:          {self.alerts}",
                *self._channel_lines(),
            ]
        )

    def _channel_lines(self) -> list[str]:
        """Channel-operation counts, when the input had any."""
        if not self.stats["channel.records"]:
            return []
        return [
            f"channel records: {self.stats['channel.records']} "
            f"(denied {self.stats['channel.denied']}, stuck {self.stats['channel.stuck']})"
        ]


class _Counted(Protocol):
    """A replay's summary: ``ingest-file``'s or ``rebuild``'s."""

    stats: Counter[str]
    runs_by_status: dict[str, int]
    alerts: int


class LedgerTally:
    """The rows of one replay folded as the ledger folds them, for the summary's counts.

    It keeps a few fields per run and per channel operation (the run row's status and
    event count), and per quarantined event or channel denial, never per applied event.
    """

    __slots__ = ("alerts", "denials", "operations", "quarantine", "runs")

    def __init__(self) -> None:
        self.runs: dict[str, tuple[int, str, int]] = {}  # run -> (version, status, events)
        self.operations: dict[str, tuple[int, bool]] = {}  # operation -> (version, stuck)
        self.quarantine: dict[tuple[str, str, str], tuple[int, str | None]] = {}  # None: retracted
        self.denials: dict[str, tuple[int, bool]] = {}  # event -> (version, counts)
        self.alerts: set[tuple[str, str]] = set()

    def add(self, batch: LedgerBatch) -> None:
        for run in batch.runs:
            _newer(self.runs, run.run_id, (run.version, run.status, run.event_count))
        for op in batch.channel_operations:
            _newer(self.operations, op.operation_id, (op.version, op.stuck))
        for q in batch.quarantine:
            _newer(self.quarantine, ("r", q.run_id, q.event_id), (q.version, _reason(q)))
        for cq in batch.channel_quarantine:
            _newer(self.quarantine, ("c", cq.operation_id, cq.event_id), (cq.version, _reason(cq)))
        for d in batch.channel_denials:
            _newer(self.denials, d.event_id, (d.version, not d.retracted))
        self.alerts.update((a.alert_id, a.state) for a in batch.alerts)

    def fill(self, summary: _Counted) -> None:
        """Set the summary's ledger counts from the folded rows."""
        stats = summary.stats
        for name in [k for k in stats if k.startswith("quarantine.")]:
            del stats[name]
        stats.update(f"quarantine.{r}" for _, r in self.quarantine.values() if r is not None)
        stats["applied"] = sum(events for _, _, events in self.runs.values())
        stats["channel.denied"] = sum(counts for _, counts in self.denials.values())
        stats["channel.stuck"] = sum(stuck for _, stuck in self.operations.values())
        summary.runs_by_status = dict(Counter(status for _, status, _ in self.runs.values()))
        summary.alerts = len(self.alerts)


def _newer(rows: dict[Any, Any], key: Any, value: tuple[Any, ...]) -> None:
    """Keep ``value`` unless the row kept has a higher version (ReplacingMergeTree)."""
    old = rows.get(key)
    if old is None or value[0] >= old[0]:
        rows[key] = value


def _reason(row: Any) -> str | None:
    return None if row.retracted else str(row.reason)


def iter_lines(stream: BinaryIO, max_bytes: int = MAX_EVENT_BYTES) -> Iterator[bytes]:
    """Lines without their newline, blank ones included (they keep line numbers right).

    An oversized line is dead-lettered whole, like an oversized Kafka record, up to a hard
    cap of 16 times ``max_bytes`` (at least 64 MiB): past that it is cut there (still
    oversized) and the rest is skipped without being held in memory.
    """
    cap = max(16 * max_bytes, 64 << 20)
    while True:
        line = stream.readline(cap)
        if not line:
            return
        if len(line) >= cap and not line.endswith(b"\n"):
            while True:  # skip the rest of an oversized line
                rest = stream.readline(1 << 20)
                if not rest or rest.endswith(b"\n"):
                    break
        yield line.rstrip(b"\r\n")


def ingest_lines(
    lines: Iterable[bytes],
    *,
    source: str,
    store: Callable[[Output], None] | None,
    config: CoreConfig | None = None,
    state: StateTable | None = None,
    batch_size: int = BATCH_SIZE,
    batch_bytes: int = 16 << 20,
    max_event_bytes: int = MAX_EVENT_BYTES,
    parse_ahead: bool = True,
    on_batch: Callable[[int], None] | None = None,
    clock: Callable[[], float] = time.time,
    gc_policy: GcPolicy | None = None,
) -> IngestSummary:
    """Replay JSONL envelopes through the core; ``store`` writes each batch's rows.

    Blank lines are skipped (and counted by number). A batch closes at ``batch_size``
    lines or ``batch_bytes`` bytes. ``store`` None: a dry run that stores nothing.
    ``parse_ahead`` (``Settings.parse_ahead``): read the next batch before this one is
    stepped and parse it in a thread while this batch is stored; the ledger and the summary
    are the same either way. ``gc_policy``: the worker's collector policy
    (``worker._gc.GcPolicy``: no automatic collection inside a batch, its survivors frozen,
    a full pass between batches once a minute), as ``ingest-file`` runs; None leaves the
    collector as it is.
    """
    config = config or CoreConfig(processing_grace=False)
    alerter = ExhaustionAlerter(config.alert_window_s, config.alert_threshold, config.lateness_s)
    intake = Intake(config, max_event_bytes=max_event_bytes, alerter=alerter)
    intake.processor(FILE_PARTITION)
    if state is not None:
        saved = dict(state.load())
        raw = saved.pop(_ALERTER_KEY, None)
        if raw:
            intake.alerter = ExhaustionAlerter.from_bytes(raw)
        intake.load(FILE_PARTITION, saved.items())
    summary = IngestSummary()
    tally = LedgerTally()

    def keep(out: Output) -> None:
        if store is not None:
            store(out)
        summary.stats.update(out.stats)
        tally.add(out.ledger)

    def persist(out: Output) -> None:
        if state is not None:
            assert intake.alerter is not None
            state.save({**out.state_writes, _ALERTER_KEY: intake.alerter.to_bytes()})

    reader = _Batches(lines, source, batch_size, batch_bytes)
    batches = iter(reader)
    batch = next(batches, None)
    ahead: _ParseAhead | None = None  # the parse of ``batch``, begun beside the last store
    try:
        while batch is not None:
            if ahead is not None:  # this step takes what was parsed and parses the rest
                ahead.stop()
            following = next(batches, None) if parse_ahead else None  # two batches in hand
            ahead = _ParseAhead(intake, following) if following else None
            step_store = keep if ahead is None else ahead.beside(keep)
            with _collector(gc_policy):
                persist(store_isolating(intake, {FILE_PARTITION: batch}, clock(), step_store))
            if gc_policy is not None:
                gc_policy.maybe_collect()
            if on_batch is not None:
                on_batch(len(batch))
            del batch  # without parse ahead the next batch is read with none in hand
            batch = following if parse_ahead else next(batches, None)
    finally:
        if ahead is not None:
            ahead.stop()
    final = intake.finalize(clock())
    final.ranges.append((source, FILE_PARTITION, reader.lines + 1, reader.lines + 1))
    keep(final)
    persist(final)
    summary.lines = reader.lines
    summary.parsed_ahead = intake.ahead_used
    tally.fill(summary)
    return summary


def _collector(policy: GcPolicy | None) -> contextlib.AbstractContextManager[None]:
    """``policy.batch()``, or nothing without a policy."""
    return contextlib.nullcontext() if policy is None else policy.batch()


class _Batches:
    """The lines as batches of records, numbered from 1; ``lines`` counts those read."""

    def __init__(self, lines: Iterable[bytes], source: str, size: int, max_bytes: int) -> None:
        self._lines, self._source, self._size, self._bytes = lines, source, size, max_bytes
        self.lines = 0

    def __iter__(self) -> Iterator[list[InRecord]]:
        batch: list[InRecord] = []
        size = 0
        for line in self._lines:
            self.lines += 1
            if line.strip():
                batch.append(InRecord(line, self._source, FILE_PARTITION, self.lines))
                size += len(line)
            if len(batch) >= self._size or size >= self._bytes:
                yield batch
                batch, size = [], 0
        if batch:
            yield batch


class _ParseAhead:
    """The next batch's parse in a thread of its own, as the worker's: it begins once this
    batch's store has (the step's own parse is done by then; the INSERTs wait on ClickHouse
    without the GIL) and ends at ``stop``, when the next step begins. That step takes each
    result by the identity of its value and parses every value not reached itself."""

    __slots__ = ("_start", "_stop", "_thread")

    def __init__(self, intake: Intake, records: list[InRecord]) -> None:
        self._start = threading.Event()
        self._stop = threading.Event()
        values = [r.value for r in records]
        self._thread = threading.Thread(
            target=self._parse, args=(intake, values), name="prism-parse-ahead", daemon=True
        )
        self._thread.start()

    def beside(self, store: Callable[[Output], None]) -> Callable[[Output], None]:
        """``store`` that lets the parse begin as it starts."""

        def storing(out: Output) -> None:
            self._start.set()
            store(out)

        return storing

    def stop(self) -> None:
        """End the parse and its thread (within one slice); what it reached stays parsed."""
        self._stop.set()
        self._start.set()
        self._thread.join()

    def _parse(self, intake: Intake, values: list[bytes | None]) -> None:
        self._start.wait()
        if self._stop.is_set():
            return
        try:
            intake.parse_ahead(
                values,
                slice_size=_PARSE_AHEAD_SLICE,
                between=lambda: time.sleep(_PARSE_AHEAD_PAUSE),
                stop=self._stop.is_set,
            )
        except Exception:  # the next step parses every value itself
            log.exception("parsing the next batch ahead failed")


def open_input(path: str) -> BinaryIO:
    """``-`` is standard input."""
    return sys.stdin.buffer if path == "-" else open(path, "rb")
