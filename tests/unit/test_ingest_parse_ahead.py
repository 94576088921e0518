"""``ingest_lines`` parses the next batch ahead, and the ledger cannot tell.

The next batch's lines are read before this batch is stepped and parsed in a thread while
this batch's rows are stored; the step takes each result by the identity of its value and
parses the rest. Over a chaotic simulated fleet the rows stored, batch by batch, and the
summary are those of the replay without parsing ahead, at several batch sizes, whether the
parse finished before the step (a store that waits, as an INSERT does without the GIL),
was cut short, or met a bisection's re-steps; and the file is read one batch ahead at most.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Iterator

import pytest

from prism.pipeline.core import CoreConfig, Output, PermanentStoreError
from prism.pipeline.ingest import BATCH_SIZE, IngestSummary, ingest_lines
from prism.pipeline.settings import Settings
from prism.runtime.simulator import FleetConfig, simulate
from prism.schemas import LedgerBatch
from tests.fixtures.final_ledger import FinalLedger
from tests.fixtures.runs import NOW

FLEET = FleetConfig(
    runs=60, seed=20261203, duplicates=0.1, reorder_window=5, post_terminal=0.2,
    conflicting_terminals=0.2, hostile=0.1, malformed=0.05, guardrail_denials=0.1,
    limit_death_burst=3, channel_operations=12, stale_after_seconds=30,
)  # fmt: skip
CONFIG = CoreConfig(stale_after_s=30, processing_grace=False)
SIZES = (3, 50, 400, 10**6)


@pytest.fixture(scope="module")
def lines() -> list[bytes]:
    values = [r.value for r in simulate(FLEET).records]
    return [*values[:100], b"", b"   ", *values[100:]]  # blank lines keep their numbers


def _waiting(ledger: FinalLedger, stored: list[LedgerBatch]) -> Callable[[Output], None]:
    """A store that waits as an INSERT does (the GIL released), then keeps the rows."""

    def store(out: Output) -> None:
        time.sleep(0.002)
        stored.append(out.ledger)
        ledger.add(out)

    return store


def _refusing(ledger: FinalLedger, stored: list[LedgerBatch]) -> Callable[[Output], None]:
    """A store that refuses every batch holding one of a few events (by the CRC of their
    ids): the step bisects, re-stepping halves while the next batch is parsed ahead."""

    def store(out: Output) -> None:
        if any(zlib.crc32(e.event_id.encode()) % 29 == 0 for e in out.ledger.events):
            raise PermanentStoreError("refused")
        stored.append(out.ledger)
        ledger.add(out)

    return store


def _replay(
    lines: list[bytes], size: int, parse_ahead: bool, kind: Callable[..., Callable[[Output], None]]
) -> tuple[list[LedgerBatch], FinalLedger, IngestSummary]:
    ledger, stored = FinalLedger(), list[LedgerBatch]()
    summary = ingest_lines(
        lines, source="file:fleet", store=kind(ledger, stored), config=CONFIG,
        batch_size=size, parse_ahead=parse_ahead, clock=lambda: NOW,
    )  # fmt: skip
    return stored, ledger, summary


def _summary(summary: IngestSummary) -> tuple[object, ...]:
    return (summary.render(), summary.lines, summary.stats, summary.runs_by_status, summary.alerts)


def test_parsing_ahead_stores_the_rows_and_summary_it_would_without(lines: list[bytes]) -> None:
    ahead_used = 0
    views = set()
    for size in SIZES:
        off = _replay(lines, size, False, _waiting)
        on = _replay(lines, size, True, _waiting)
        assert on[0] == off[0], size  # every batch's rows, in order, field by field
        assert _summary(on[2]) == _summary(off[2]), size
        assert off[2].parsed_ahead == 0
        ahead_used += on[2].parsed_ahead
        views.add(repr((on[1].snapshot(), on[1].billing())))
    # the step took parses made ahead (all but the first batch's, with a store that waits)
    assert ahead_used > len(lines)
    assert len(views) == 1  # and the views are the same at every batch size


@pytest.mark.parametrize("size", [7, 200])
def test_a_bisection_beside_the_parse_ahead_stores_what_it_would_without(
    lines: list[bytes], size: int
) -> None:
    off = _replay(lines, size, False, _refusing)
    on = _replay(lines, size, True, _refusing)
    assert off[2].stats["dlq.unstorable"] > 0  # the store refused, the step bisected
    assert on[0] == off[0]
    assert _summary(on[2]) == _summary(off[2])


@pytest.mark.parametrize(("parse_ahead", "batches_read"), [(True, 2), (False, 1)])
def test_the_file_is_read_at_most_one_batch_ahead(
    lines: list[bytes], parse_ahead: bool, batches_read: int
) -> None:
    size, read, done, widest = 40, [0], [0], [0]

    def reading() -> Iterator[bytes]:
        for line in lines[:400]:
            if line.strip():
                read[0] += 1
                yield line

    def store(out: Output) -> None:
        widest[0] = max(widest[0], read[0] - done[0])

    ingest_lines(
        reading(), source="file:f", store=store, config=CONFIG, batch_size=size,
        parse_ahead=parse_ahead, on_batch=lambda n: done.__setitem__(0, done[0] + n),
        clock=lambda: NOW,
    )  # fmt: skip
    assert widest[0] == batches_read * size


def test_batches_are_the_workers() -> None:
    assert BATCH_SIZE == Settings.model_fields["batch_max_events"].default == 20_000
    sizes: list[int] = []
    ingest_lines([b"{}"] * 45_000, source="file:f", store=None, config=CONFIG,
                 on_batch=sizes.append, clock=lambda: NOW)  # fmt: skip
    assert sizes == [20_000, 20_000, 5_000]
