"""The file replayer: lines, batches by count and bytes, state kept between invocations."""

from __future__ import annotations

import io
from collections.abc import Iterator, Mapping

import orjson

from prism.pipeline.core import CoreConfig
from prism.pipeline.ingest import ingest_lines, iter_lines
from tests.fixtures.final_ledger import FinalLedger
from tests.fixtures.runs import NOW, RunBuilder

CFG = CoreConfig(grace_period_s=30, processing_grace=False)


class MemoryState:
    """``sinks.StateTable`` without ClickHouse: what one ledger database would keep."""

    def __init__(self) -> None:
        self.saved: dict[str, bytes] = {}

    def load(self) -> Iterator[tuple[str, bytes]]:
        yield from self.saved.items()

    def save(self, writes: Mapping[str, bytes | None]) -> None:
        for key, value in writes.items():
            if value is None:
                self.saved.pop(key, None)
            else:
                self.saved[key] = value


def _lines(events: list[dict[str, object]]) -> list[bytes]:
    return [orjson.dumps(e) for e in events]


def test_lines_keep_their_numbers_and_an_oversized_line_is_not_held_whole() -> None:
    big = b"x" * (200 << 20)  # 200 MiB on one line
    stream = io.BytesIO(b'{"a":1}\r\n\n' + big + b"\n" + b"last")
    lines = list(iter_lines(stream, max_bytes=1 << 20))
    assert [len(v) for v in lines] == [7, 0, 64 << 20, 4]


def test_a_backfill_split_over_invocations_equals_one_file() -> None:
    fleet = []
    for i in range(6):
        b = RunBuilder(f"r{i}").started()
        b.turn(1).usage(turn=1, attempt=1, inputTokens=10, cost="0.1", currency="USD")
        if i % 2:
            b.finished()
        fleet += b.events
    fleet.append(dict(fleet[3], eventId="resend-of-3"))  # a duplicate claim, seq taken
    post = RunBuilder("r1").started().turn(1).usage(turn=1, attempt=1).finished()
    post.turn(2).usage(turn=2, attempt=1, inputTokens=9, cost="9", currency="USD")
    fleet += post.events[4:]  # r1's post-terminal turn and usage
    whole = FinalLedger()
    ingest_lines(_lines(fleet), source="file:all", store=whole.add, config=CFG, clock=lambda: NOW)

    split = FinalLedger()
    state = MemoryState()
    for part in (fleet[:11], fleet[11:20], fleet[20:]):
        summary = ingest_lines(
            _lines(part), source="file:part", store=split.add, config=CFG, state=state,  # type: ignore[arg-type]
            batch_size=4, clock=lambda: NOW,
        )  # fmt: skip
    assert split.snapshot() == whole.snapshot()
    assert split.billing() == whole.billing()
    assert (
        split.reasons()
        == whole.reasons()
        == {"resend-of-3": "duplicate_seq", "r1-e4": "post_terminal", "r1-e5": "post_terminal"}
    )
    assert summary.lines == len(fleet) - 20


def test_batches_close_on_bytes_too() -> None:
    b = RunBuilder().started()
    for turn in range(1, 9):
        b.turn(turn)
    sizes: list[int] = []
    ingest_lines(_lines(b.events), source="file:t", store=None, config=CFG, batch_size=1000,
                 batch_bytes=900, on_batch=sizes.append, clock=lambda: NOW)  # fmt: skip
    assert sum(sizes) == len(b.events) and max(sizes) < len(b.events)


def test_the_workers_collector_policy_keeps_collection_out_of_batches_and_changes_no_row() -> None:
    import gc

    from prism.pipeline.worker._gc import GcPolicy

    fleet = []
    for i in range(8):
        b = RunBuilder(f"r{i}").started()
        b.turn(1).usage(turn=1, attempt=1, inputTokens=10 + i, cost="0.1", currency="USD")
        fleet += b.finished().events if i % 3 else b.events
    plain = FinalLedger()
    ingest_lines(_lines(fleet), source="file:f", store=plain.add, config=CFG, batch_size=5,
                 clock=lambda: NOW)  # fmt: skip

    enabled_in_store: list[bool] = []
    kept = FinalLedger()

    def store(out):  # type: ignore[no-untyped-def]
        enabled_in_store.append(gc.isenabled())
        kept.add(out)

    policy = GcPolicy(full_every=0.0, duty=None)  # a full pass after every batch
    assert gc.isenabled()
    try:
        summary = ingest_lines(_lines(fleet), source="file:f", store=store, config=CFG,
                               batch_size=5, clock=lambda: NOW, gc_policy=policy)  # fmt: skip
    finally:
        gc.unfreeze()
    batches = -(-len(fleet) // 5)
    assert enabled_in_store[:batches] == [False] * batches  # no automatic pass inside a batch
    assert gc.isenabled()  # and the collector is back on after the replay
    assert policy.full_passes == batches
    assert kept.snapshot() == plain.snapshot() and kept.billing() == plain.billing()
    assert summary.lines == len(fleet)
