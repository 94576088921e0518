"""The file replayer: JSONL envelopes -> the same core -> the same ledger, without Kafka.

For backfills, debugging and reproducible results. Malformed lines go to the dead-letter
table with their line number; at the end of input every run whose terminal arrived is
closed (gaps recorded) and the stale rule runs on the event-time watermark. Processing
time never enters (``now`` is fixed), so the same file always gives the same ledger.

Example::

    summary = ingest_lines(open("fleet.jsonl", "rb"), source="file:fleet.jsonl", sink=writer)
    print(summary.render())
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import islice
from typing import Any, BinaryIO, Protocol

from prism.schemas import (
    ContractViolation,
    DeadLetterRow,
    LedgerBatch,
    dead_letter_preview,
    parse_batch,
)

from .core import CoreConfig, Delivery, ExhaustionAlerter, Output, Processor

__all__ = ["IngestSummary", "LedgerSink", "dead_letter_row", "ingest_lines", "iter_lines"]

_FIXED_NOW = 0.0  # file replay judges grace and staleness on event time only


class LedgerSink(Protocol):
    """What the replayer needs from the ledger writer (``sinks.LedgerWriter`` fits)."""

    def add(self, batch: LedgerBatch, source: Any) -> None: ...

    def flush(self) -> Any: ...


@dataclass(slots=True)
class IngestSummary:
    """Counts a user checks after a replay."""

    lines: int = 0
    stats: Counter[str] = field(default_factory=Counter)
    dlq: Counter[str] = field(default_factory=Counter)
    runs_by_status: dict[str, int] = field(default_factory=dict)
    alerts: int = 0

    def render(self) -> str:
        out = [
            f"lines read:      {self.lines}",
            f"events applied:  {self.stats['applied']}",
            f"duplicates:      {self.stats['duplicate']}",
        ]
        out.append(
            "runs by status:  "
            + (", ".join(f"{k}={v}" for k, v in sorted(self.runs_by_status.items())) or "none")
        )
        out.append(
            "dead letters:    "
            + (", ".join(f"{k}={v}" for k, v in sorted(self.dlq.items())) or "none")
        )
        quarantine = {
            k.split(".", 1)[1]: v for k, v in self.stats.items() if k.startswith("quarantine.")
        }
        out.append(
            "quarantined:     "
            + (", ".join(f"{k}={v}" for k, v in sorted(quarantine.items())) or "none")
        )
        out.append(f"alerts:          {self.alerts}")
        return "\n".join(out)


def dead_letter_row(
    raw: bytes,
    violation: ContractViolation,
    source: str,
    partition: int,
    offset: int,
    received_at: datetime,
) -> DeadLetterRow:
    """The dead-letter row of a record that could not be parsed or breaks the contract.

    The ledger keeps the size, hash and a redacted preview; the bytes stay on the DLQ topic.
    """
    kept = dead_letter_preview(raw)
    return DeadLetterRow(
        source=source,
        partition=partition,
        offset=offset,
        code=violation.code,
        reason=violation.reason,
        size=kept.size,
        sha256=kept.sha256,
        preview=kept.preview,
        received_at=received_at,
    )


def iter_lines(stream: BinaryIO) -> Iterator[bytes]:
    """Lines without their newline; blank lines are skipped (and still counted by number)."""
    for line in stream:
        yield line.rstrip(b"\r\n")


def ingest_lines(
    lines: Iterable[bytes],
    *,
    source: str,
    sink: LedgerSink | None,
    config: CoreConfig | None = None,
    batch_size: int = 5000,
    max_event_bytes: int | None = None,
    on_batch: Callable[[int], None] | None = None,
    received_at: datetime | None = None,
) -> IngestSummary:
    """Replay JSONL envelopes through the core into ``sink``; return what happened."""
    from prism.sinks import SourceRange

    proc = Processor(config or CoreConfig(), partition=-1)
    alerter = ExhaustionAlerter(proc.config.alert_window_s, proc.config.alert_threshold)
    summary = IngestSummary()
    statuses: dict[str, str] = {}
    received = received_at or datetime.now(UTC)
    kwargs = {} if max_event_bytes is None else {"max_bytes": max_event_bytes}
    it = iter(lines)
    line_no = 0
    while True:
        chunk = list(islice(it, batch_size))
        if not chunk:
            break
        first = line_no + 1
        numbered = [(first + i, v) for i, v in enumerate(chunk) if v.strip()]
        line_no += len(chunk)
        out = Output()
        deliveries = []
        for (num, raw), parsed in zip(
            numbered, parse_batch([v for _, v in numbered], **kwargs), strict=True
        ):
            if isinstance(parsed, ContractViolation):
                out.ledger.dead_letters.append(
                    dead_letter_row(raw, parsed, source, -1, num, received)
                )
                summary.dlq[parsed.code] += 1
            else:
                deliveries.append(Delivery(parsed, source, -1, num, received))
        out.extend(proc.process(deliveries, now=_FIXED_NOW))
        _alerts(out, alerter, proc)
        summary.lines = line_no
        _emit(out, sink, SourceRange(source, -1, first, line_no), summary, statuses)
        if on_batch is not None:
            on_batch(len(chunk))
    out = proc.finalize(now=_FIXED_NOW)
    _alerts(out, alerter, proc)
    _emit(out, sink, SourceRange(source, -1, line_no + 1, line_no + 1), summary, statuses)
    summary.runs_by_status = dict(Counter(statuses.values()))
    return summary


def _alerts(out: Output, alerter: ExhaustionAlerter, proc: Processor) -> None:
    from .core import alert_record

    rows = alerter.observe(out.limit_deaths) + alerter.advance(proc.watermark_us)
    out.ledger.alerts.extend(rows)
    out.alerts.extend(alert_record(r) for r in rows)


def _emit(
    out: Output, sink: LedgerSink | None, rng: Any, summary: IngestSummary, statuses: dict[str, str]
) -> None:
    summary.stats.update(out.stats)
    summary.alerts += len(out.ledger.alerts)
    for row in out.ledger.runs:
        statuses[row.run_id] = row.status
    if sink is not None and len(out.ledger):
        sink.add(out.ledger, rng)
        sink.flush()


def open_input(path: str) -> BinaryIO:
    """``-`` is standard input."""
    return sys.stdin.buffer if path == "-" else open(path, "rb")
