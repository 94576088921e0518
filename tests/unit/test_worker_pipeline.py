"""The worker's batch pipeline keeps its order while batch N's outputs overlap N+1's store.

Driven through ``PipelineWorker._handle_batch`` and ``_tick`` without a broker: the ledger
writer, the producer and faust's acknowledgement are recorders on one timeline, so the
assertions are about what happened in which order:

- a batch's records, state writes and acknowledgement come only after its rows are in
  the ledger, and in batch order;
- the watermark a batch reports to the alerter is the one captured when it was stored,
  not the clock's value once later batches were stepped;
- the timer tick finishes the stored batch before writing anything of its own for the
  batch's lanes, and leaves it alone while those lanes are busy (stepped within the
  interval, or with records waiting);
- nothing is stepped while a rebalance is under way, and a batch stepped before one began
  gets no state write and no acknowledgement after it, even when its lane comes back;
- a batch's acknowledgement starts at the group's committed offset when the offsets from
  there were processed before, delivered again or not.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from faust.types import TP

from prism.pipeline.core import InRecord
from prism.pipeline.settings import Settings
from prism.pipeline.worker import _app
from prism.pipeline.worker._app import PipelineWorker
from prism.pipeline.worker._bulk import Chunk
from prism.runtime.simulator import FleetConfig, simulate


class _Timeline:
    def __init__(self) -> None:
        self.steps: list[tuple[str, Any]] = []


class _Writer:
    """A ledger sink that records each flush of rows on the timeline."""

    def __init__(self, timeline: _Timeline) -> None:
        self.timeline = timeline
        self.pending: list[Any] = []

    def add(self, batch: Any, *sources: Any) -> None:
        self.pending.append((len(batch), sources))

    def flush(self) -> None:
        for rows, sources in self.pending:
            self.timeline.steps.append(("ledger", (rows, [s.last_offset for s in sources])))
        self.pending.clear()

    def discard(self) -> int:
        return 0


@pytest.fixture
def worker(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[PipelineWorker, _Timeline]:
    timeline = _Timeline()
    settings = Settings(state_dir=tmp_path, state_store="memory", progress_interval_seconds=0)
    now = [1_800_000_000.0]
    w = PipelineWorker(settings, _Writer(timeline), clock=lambda: now[0])
    w.now = now  # type: ignore[attr-defined]  # the test moves processing time

    changelogs: dict[tuple[str, int], dict[bytes, bytes]] = {}  # what the broker keeps

    async def send_all(records: list[Any]) -> None:
        if records:
            await asyncio.sleep(0.01)  # the broker takes a while: let the other side run
            timeline.steps.append(("produce", list(records)))
            for r in records:
                if r.topic.endswith("-changelog"):
                    changelogs.setdefault((r.topic, r.partition), {})[r.key] = r.value

    async def log_start(partition: int) -> int:
        return 0

    def acknowledge(app: Any, tp: Any, first: int, last: int) -> int:
        timeline.steps.append(("ack", (tp.partition, first, last)))
        return last - first + 1

    def reader(topic: str) -> Any:
        async def read_many(partitions: Any) -> dict[int, dict[bytes, bytes]]:
            return {  # what the next owner reads
                p: {k: v for k, v in changelogs.get((topic, p), {}).items() if v}
                for p in partitions
            }

        return read_many

    monkeypatch.setattr(w.producer, "send_all", send_all)
    monkeypatch.setattr(w.state_reader, "read_many", reader(w._changelog))
    monkeypatch.setattr(w.alerts.reader, "read_many", reader(w.alerts.changelog))
    monkeypatch.setattr(w.read_back, "log_start", log_start)
    monkeypatch.setattr(_app, "acknowledge", acknowledge)
    return w, timeline


def _records(topic: str) -> list[InRecord]:
    """A small fleet on one partition, offsets from 0, in publish order."""
    fleet = simulate(FleetConfig(runs=30, seed=5))
    return [InRecord(r.value, topic, 0, i, r.key, None) for i, r in enumerate(fleet.records)]


def _batch(w: PipelineWorker, recs: list[InRecord]) -> Any:
    return w._handle_batch({0: list(recs)})


def _watermarks(records: list[Any], topic: str = ".limit-deaths") -> list[int]:
    """The event-time marks of the lane reports among ``records`` sent to the alerter's
    topic (rule 16), or to another ``topic``."""
    return [
        orjson.loads(r.value)["mark"]
        for r in records
        if r.key.startswith(b"lane:") and r.topic.endswith(topic)
    ]


def _state(w: PipelineWorker, records: list[Any]) -> list[Any]:
    return [r for r in records if r.topic == w._changelog]


def test_outputs_state_and_acks_follow_the_ledger_in_batch_order(worker: Any) -> None:
    w, timeline = worker
    recs = _records(w.topics.input)
    half = len(recs) // 2

    finish = w._finish_stored

    async def late_finish(*args: Any) -> None:
        await asyncio.sleep(0.3)  # batch 2 is stepped (in its thread) before batch 1 finishes
        await finish(*args)

    w._finish_stored = late_finish  # type: ignore[method-assign]

    async def go() -> tuple[int, int]:
        await _batch(w, recs[:half])
        assert [s[0] for s in timeline.steps] == ["ledger"]  # nothing produced or acked yet
        wm1 = w.intake.clock.watermark_us
        await _batch(w, recs[half:])
        wm2 = w.intake.clock.watermark_us
        await w._tick()  # lane 0 was just stepped: the tick leaves the stored batch alone
        assert [kind for kind, _ in timeline.steps].count("produce") == 1
        w.now[0] += 5  # lane 0 is quiet now: the tick finishes batch 2 before its own work
        await w._tick()
        return wm1, wm2

    wm1, wm2 = asyncio.run(go())
    assert wm2 > wm1, "the second half must move the watermark for this test to mean anything"
    steps = timeline.steps
    kinds = [kind for kind, _ in steps]
    ledger = [i for i, kind in enumerate(kinds) if kind == "ledger"]
    produce = [i for i, kind in enumerate(kinds) if kind == "produce"]
    ack = [i for i, kind in enumerate(kinds) if kind == "ack"]
    assert len(ack) == 2 and len(ledger) >= 2 and len(produce) == 3
    # each batch: ledger, then its records and state, then its acknowledgement; and batch 1's
    # finish is over before batch 2's begins (batch 2's store may overlap batch 1's finish)
    assert ledger[0] < produce[0] < ack[0] < produce[1] < ack[1]
    assert ledger[1] < produce[1]
    assert produce[2] > ack[1]  # the tick's own state writes come after batch 2's
    assert set(_watermarks(steps[produce[2]][1])) <= {wm2}  # a changed report, never older
    assert steps[ledger[0]][1][1] == [half - 1]  # the ledger rows of batch 1's offsets
    assert steps[ack[0]][1] == (0, 0, half - 1)
    assert steps[ack[1]][1] == (0, half, len(recs) - 1)
    first_out, second_out = steps[produce[0]][1], steps[produce[1]][1]
    # batch 1 reports the mark it was stored with, though batch 2 was stepped since
    assert _watermarks(first_out) == [wm1]
    assert _watermarks(second_out) == [wm2]
    # the same reports go to the lane-marks topic every worker reads (one watermark)
    assert _watermarks(first_out, ".lane-marks") == [wm1]
    assert _watermarks(second_out, ".lane-marks") == [wm2]
    assert _state(w, first_out) and _state(w, second_out)
    assert all(r.partition == 0 for r in _state(w, first_out + second_out))


def _all_lanes(w: PipelineWorker) -> set[TP]:
    return {TP(w.topics.input, p) for p in range(w.settings.partitions)}


def _chunk(w: PipelineWorker, recs: list[InRecord], generation: int) -> Chunk:
    fetched = [
        SimpleNamespace(value=r.value, topic=r.source, partition=0, offset=r.offset, key=r.key,
                        headers=[])
        for r in recs
    ]  # fmt: skip
    return Chunk(w.topics.input, 0, fetched, generation)


async def _rebalance_under_way(w: PipelineWorker, chunk: Chunk) -> asyncio.Future[None]:
    """The chunk's batch waits for the lock (a tick holds it) while a rebalance begins;
    returns the waiting batch once nothing more happens to it before the rebalance ends."""
    async with w._lock:
        waiting = asyncio.ensure_future(w.handle_chunks([chunk]))
        await asyncio.sleep(0.05)
        w.app.on_rebalance_start()
        await w._on_revoked(w.app, _all_lanes(w))
    await w._tick()  # the timer steps nothing either
    await asyncio.sleep(0.2)
    assert not waiting.done()
    return waiting


def test_a_batch_fetched_before_a_rebalance_waits_for_its_end_and_is_dropped(worker: Any) -> None:
    # The consumer's generation reads as the old one until the join completes: only the
    # rebalance itself tells the batch is stale while it waits for the lock.
    w, timeline = worker
    recs = _records(w.topics.input)
    chunk = _chunk(w, recs, w.app.consumer_generation_id)

    async def go() -> None:
        waiting = await _rebalance_under_way(w, chunk)
        assert timeline.steps == []
        w.app.consumer_generation_id += 1  # the join completed...
        w.app.on_rebalance_end()  # ...and the new assignment's tables are recovered
        await waiting

    asyncio.run(go())
    assert timeline.steps == []
    assert w.stats["records_dropped_rebalance"] == len(recs)
    assert not w._loaded and not w.intake.processors  # no lane restored from the old table


def test_a_batch_fetched_as_a_rebalance_ends_is_stepped_after_it(worker: Any) -> None:
    # faust seeks to the committed offsets and resumes fetching just before the rebalance
    # is over: a batch fetched then is not fetched again, so it must not be dropped.
    w, timeline = worker
    recs = _records(w.topics.input)
    chunk = _chunk(w, recs, w.app.consumer_generation_id + 1)

    async def go() -> None:
        w.app.consumer_generation_id += 1
        waiting = await _rebalance_under_way(w, chunk)
        assert timeline.steps == []
        w.app.on_rebalance_end()
        await waiting

    asyncio.run(go())
    assert [kind for kind, _ in timeline.steps] == ["ledger"]
    assert w.stats["records_dropped_rebalance"] == 0


def test_a_batch_stepped_before_a_rebalance_gets_no_state_or_ack_after_it(worker: Any) -> None:
    w, timeline = worker
    recs = _records(w.topics.input)
    half = len(recs) // 2

    async def go() -> None:
        await _batch(w, recs[:half])  # in the ledger, steps 3-4 to come
        w.app.on_rebalance_start()
        await w._on_revoked(w.app, _all_lanes(w))
        w.app.on_rebalance_end()  # lane 0 is this worker's again, its table recovered
        await w._tick()
        await _batch(w, recs)  # delivered again from the last commit

    asyncio.run(go())
    produced = [step for kind, step in timeline.steps if kind == "produce"]
    acks = [step for kind, step in timeline.steps if kind == "ack"]
    assert len(produced) == 1  # the first batch's records go out: its rows are in the ledger
    assert _watermarks(produced[0])  # and its report to the alerter
    assert _state(w, produced[0]) == []
    assert acks == []
    assert w.stats["batches_unacknowledged_rebalance"] == 1


def test_offsets_processed_before_but_not_delivered_again_are_acknowledged(
    worker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The group committed offset 3; the lane's restored state says 0..half-1 are processed;
    # the consumer delivers from half on. 3..half-1 are acknowledged with the batch, or
    # faust's commits would stop at 3 for good.
    w, timeline = worker
    recs = _records(w.topics.input)
    half = len(recs) // 2

    async def go() -> None:
        await _batch(w, recs[:half])
        await w._finish_stored()
        w.app.on_rebalance_start()
        await w._on_revoked(w.app, _all_lanes(w))
        w.app.on_rebalance_end()
        monkeypatch.setattr(_app, "committed_offset", lambda app, tp: 3)
        await _batch(w, recs[half:])
        await w._finish_stored()

    asyncio.run(go())
    acks = [step for kind, step in timeline.steps if kind == "ack"]
    assert acks == [(0, 0, half - 1), (0, 3, len(recs) - 1)]
    assert w.stats["offsets_read_back"] == 0


def test_the_tick_leaves_a_lane_with_records_waiting_to_its_next_step(worker: Any) -> None:
    w, timeline = worker
    recs = _records(w.topics.input)

    async def go() -> list[str]:
        await _batch(w, recs)
        w.now[0] += 5  # long past the tick interval, but lane 0 has records queued
        w.bulk._chunks.append(Chunk(w.topics.input, 0, [], w.app.consumer_generation_id))
        await w._tick()
        kinds = [kind for kind, _ in timeline.steps]
        w.bulk._chunks.clear()  # taken: lane 0 is quiet now
        await w._tick()
        return kinds

    busy = asyncio.run(go())
    assert busy == ["ledger"]  # neither the stored batch's finish nor a tick of lane 0
    kinds = [kind for kind, _ in timeline.steps]
    assert kinds[:3] == ["ledger", "produce", "ack"] and kinds.count("produce") == 2


def test_an_event_that_would_outgrow_a_changelog_record_is_dead_lettered(worker: Any) -> None:
    """Rule 15: a run whose state would not fit in one record must not stop the partition."""
    from tests.fixtures.runs import RunBuilder

    w, timeline = worker
    b = RunBuilder("big").started()
    for _ in range(3):  # each under max_event_bytes; their facts together are not
        b.add("custom.blob", {"notes": "x" * 700_000})
    b.finished()
    small = RunBuilder("small").started().finished()
    values = [orjson.dumps(e) for e in b.events + small.events]
    recs = [InRecord(v, w.topics.input, 0, i, None, None) for i, v in enumerate(values)]

    async def go() -> None:
        await _batch(w, recs)
        await w._finish_stored()

    asyncio.run(go())
    produced = [r for kind, step in timeline.steps if kind == "produce" for r in step]
    dlq = [r for r in produced if r.topic == w.topics.dlq]
    assert [r.value for r in dlq] == [values[3]]  # the blob that would take it over the limit
    headers = dict(dlq[0].headers)
    assert headers["reason-code"] == b"unstorable"
    assert b"changelog record" in headers["reason"] and b"'big'" in headers["reason"]
    state = _state(w, produced)
    assert state and max(len(r.value or b"") for r in state) <= w.settings.max_state_bytes
    assert [step for kind, step in timeline.steps if kind == "ack"] == [(0, 0, len(recs) - 1)]


def test_the_stats_file_reports_where_the_step_thread_spent_its_time(worker: Any) -> None:
    w, _ = worker
    recs = _records(w.topics.input)
    half = len(recs) // 2
    flush = w.store.writer.flush

    def slow_flush() -> None:
        time.sleep(0.05)  # the ledger takes a while: the store stage must show it
        flush()

    w.store.writer.flush = slow_flush  # type: ignore[method-assign]

    async def go() -> None:
        w.telemetry.consumed(half)
        await _batch(w, recs[:half])
        await asyncio.sleep(0.02)  # between the two steps
        w.telemetry.consumed(len(recs) - half)
        await _batch(w, recs[half:])

    asyncio.run(go())
    seconds = w.telemetry.stage_seconds
    assert set(seconds) == {"step_thread", "step_thread_cpu", "store", "between_steps"}
    assert 0.1 <= seconds["store"] < seconds["step_thread"]  # two stores of >= 50 ms each
    assert seconds["step_thread_cpu"] > 0 and seconds["between_steps"] >= 0.02
    w.telemetry.write_stats(force=True)
    doc = orjson.loads((w.settings.state_dir / "worker-stats.json").read_bytes())
    per_event = {k: v / len(recs) * 1e6 for k, v in seconds.items()}
    assert doc["stage_us"] == pytest.approx(per_event, rel=1e-3)


@pytest.mark.parametrize("enabled", [True, False], ids=["parse-ahead", "off"])
def test_the_next_batch_is_parsed_beside_this_ones_store(worker: Any, enabled: bool) -> None:
    """The records queued behind a batch are parsed once its core step is done (while its
    store runs), and the next step takes those results; off, nothing is parsed ahead."""
    from prism.pipeline.worker._faust import in_record

    w, timeline = worker
    w.settings = w.settings.model_copy(update={"parse_ahead": enabled})
    recs = _records(w.topics.input)
    half = len(recs) // 2
    msgs = [
        SimpleNamespace(value=r.value, topic=r.source, partition=0, offset=r.offset, key=r.key,
                        headers=[])
        for r in recs[half:]
    ]  # fmt: skip
    # batch 2 is queued in the bulk intake while batch 1 is stepped
    w.bulk._chunks.append(Chunk(w.topics.input, 0, msgs, w.app.consumer_generation_id))
    events: list[tuple[str, float]] = []
    step, parse_ahead = w.intake.step, w.intake.parse_ahead

    def recording_step(*args: Any, **kwargs: Any) -> Any:
        out = step(*args, **kwargs)
        events.append(("stepped", time.perf_counter()))
        return out

    def recording_parse_ahead(values: Any, **kwargs: Any) -> int:
        events.append(("parse_ahead", time.perf_counter()))
        return parse_ahead(values, **kwargs)

    w.intake.step = recording_step  # type: ignore[method-assign]
    w.intake.parse_ahead = recording_parse_ahead  # type: ignore[method-assign]

    async def go() -> int:
        await _batch(w, recs[:half])
        used = w.intake.ahead_used
        # the worker does not wait for the parse (the next step parses what it has not);
        # the test does, so that it has parsed everything
        await asyncio.gather(*w._ahead_tasks)
        w.bulk._chunks.clear()  # taken
        await w._handle_batch({0: [in_record(m) for m in msgs]})
        await w._finish_stored()
        return used

    used_by_first = asyncio.run(go())
    assert used_by_first == 0  # nothing was parsed ahead for the first batch
    acks = [step for kind, step in timeline.steps if kind == "ack"]
    assert acks == [(0, 0, half - 1), (0, half, len(recs) - 1)]
    kinds = [kind for kind, _ in events]
    if not enabled:
        assert kinds == ["stepped", "stepped"] and w.intake.ahead_used == 0
        assert "parse_ahead" not in w.telemetry.stage_seconds
        return
    assert kinds == ["stepped", "parse_ahead", "stepped"]  # only after batch 1's core step
    assert w.intake.ahead_used == len({id(m.value) for m in msgs if m.value}) > 0
    assert w.telemetry.stage_seconds["parse_ahead"] > 0
    w.telemetry.write_stats(force=True)
    doc = orjson.loads((w.settings.state_dir / "worker-stats.json").read_bytes())
    assert doc["parsed_ahead"] == w.intake.ahead_used


def test_a_step_stops_the_parse_of_its_batch_and_starts_the_next_at_its_store(
    worker: Any,
) -> None:
    w, _ = worker
    recs = _records(w.topics.input)
    previous, ahead = _app._ParseAhead(), _app._ParseAhead()
    flush = w.store.writer.flush
    seen: list[tuple[bool, bool]] = []

    def flush_seeing() -> None:  # what the store sees when it begins
        seen.append((previous.stop.is_set(), ahead.start.is_set()))
        flush()

    w.store.writer.flush = flush_seeing  # type: ignore[method-assign]
    w._settle()
    w._step_and_store({0: recs}, w.now[0], previous, ahead)
    assert seen == [(True, True)]  # the earlier parse was told to stop; this one may start
    assert not ahead.stop.is_set()  # the next batch's parse runs on until its step begins


@pytest.mark.parametrize("queued", [False, True])
def test_records_not_delivered_for_a_while_are_read_back_by_the_timer(
    worker: Any, monkeypatch: pytest.MonkeyPatch, queued: bool
) -> None:
    """A partition whose end stays past the worker's position with nothing of it queued
    (the consumer dropped the fetch and will not fetch it again) is read back from that
    position and stepped; a partition with records queued is left to its next batch."""
    w, timeline = worker
    object.__setattr__(w, "settings", w.settings.model_copy(
        update={"undelivered_read_back_seconds": 0.05}))  # fmt: skip
    recs = _records(w.topics.input)
    half = len(recs) // 2
    reads: list[tuple[int, list[tuple[int, int]]]] = []

    async def read(partition: int, ranges: list[tuple[int, int]]) -> list[InRecord]:
        reads.append((partition, ranges))
        return [r for r in recs if any(a <= r.offset < b for a, b in ranges)]

    monkeypatch.setattr(w.read_back, "read", read)
    monkeypatch.setattr(w.app.consumer, "assignment", lambda: {TP(w.topics.input, 0)})
    monkeypatch.setattr(_app, "highwater", lambda app, tp: len(recs))

    async def go() -> None:
        await _batch(w, recs[:half])
        await w._finish_stored()
        if queued:
            w.bulk._chunks.append(Chunk(w.topics.input, 0, [], w.app.consumer_generation_id))
        await w._tick()  # lane 0 is behind from now on: not yet long enough
        assert reads == []
        await asyncio.sleep(0.1)
        await w._tick()
        await w._finish_stored()

    asyncio.run(go())
    acks = [step for kind, step in timeline.steps if kind == "ack"]
    if queued:
        assert reads == [] and acks == [(0, 0, half - 1)]
        return
    assert reads == [(0, [(half, len(recs))])]
    assert acks == [(0, 0, half - 1), (0, half, len(recs) - 1)]
    assert w.intake.next_offset(0) == len(recs)
    assert w.stats["offsets_read_undelivered"] == len(recs) - half


def test_reading_back_undelivered_records_can_be_turned_off(
    worker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    w, timeline = worker
    object.__setattr__(w, "settings", w.settings.model_copy(
        update={"undelivered_read_back_seconds": 0.0}))  # fmt: skip
    recs = _records(w.topics.input)

    async def read(partition: int, ranges: list[tuple[int, int]]) -> list[InRecord]:
        raise AssertionError("read back with the setting at 0")

    monkeypatch.setattr(w.read_back, "read", read)
    monkeypatch.setattr(w.app.consumer, "assignment", lambda: {TP(w.topics.input, 0)})
    monkeypatch.setattr(_app, "highwater", lambda app, tp: 2 * len(recs))

    async def go() -> None:
        await _batch(w, recs)
        await w._finish_stored()
        for _ in range(3):
            await w._tick()
            await asyncio.sleep(0.02)

    asyncio.run(go())
    assert [step for kind, step in timeline.steps if kind == "ack"] == [(0, 0, len(recs) - 1)]
