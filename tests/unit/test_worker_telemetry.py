"""The worker continues the producer's trace per batch and records what it measured."""

from __future__ import annotations

import json
import random
import time
from collections import Counter

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from prism.pipeline.worker._telemetry import FRESH_STRIDE, WorkerTelemetry, _Reservoir
from prism.runtime import InMemoryPublisher


@pytest.fixture
def otel():
    spans = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader])
    yield tp, spans, mp, reader
    tp.shutdown()
    mp.shutdown()


@pytest.mark.timeout(30)
async def test_publisher_span_and_worker_batch_span_share_a_trace(otel, tmp_path):
    tp, spans, mp, _reader = otel
    publisher = InMemoryPublisher()
    with tp.get_tracer("agent").start_as_current_span("agent.run") as agent_span:
        run = publisher.run("run-1", tenant_id="acme")
        run.emit("agent_started", {})
        run.emit("agent_finished", {"finishReason": "stop"})
    with tp.get_tracer("other").start_as_current_span("other.run"):
        publisher.run("run-2", tenant_id="acme").emit("agent_started", {})
    traceparents = [
        publisher.headers_of(e["eventId"])["traceparent"].decode() for e in publisher.events
    ]

    tel = WorkerTelemetry(tmp_path / "worker-stats.json", tracer_provider=tp, meter_provider=mp)
    with tel.batch_span(len(traceparents), traceparents), tel.insert_span(rows=3):
        pass

    by_name = {s.name: s for s in spans.get_finished_spans()}
    batch, insert = by_name["prism.worker.batch"], by_name["prism.ledger.insert"]
    assert batch.context.trace_id == agent_span.get_span_context().trace_id
    assert insert.parent.span_id == batch.context.span_id
    linked = {link.context.span_id for link in batch.links}
    assert agent_span.get_span_context().span_id in linked and len(linked) == 2


def test_stats_file_reports_freshness_and_counts(otel, tmp_path):
    _, _, mp, reader = otel
    tel = WorkerTelemetry(tmp_path / "worker-stats.json", meter_provider=mp)
    tel.consumed(4)
    from collections import Counter

    tel.outcomes(Counter({"applied": 3, "dlq.unparsable": 1}))
    import time

    now = time.time()
    tel.acknowledged([now - 0.5, now - 0.2, now - 0.1])
    tel.write_stats(force=True)
    doc = json.loads((tmp_path / "worker-stats.json").read_text())
    assert (doc["events"], doc["applied"], doc["rejected"]) == (4, 3, {"dlq.unparsable": 1})
    assert doc["freshness_ms"]["count"] == 3 and 90 <= doc["freshness_ms"]["p50"] <= 1000
    names = {
        m.name
        for rm in reader.get_metrics_data().resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    assert {"prism.events.consumed", "prism.events.outcome", "prism.freshness"} <= names


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def test_a_status_line_every_n_seconds_with_consumed_lag_freshness_and_rejects(
    tmp_path, caplog
) -> None:
    clock = Clock()
    tel = WorkerTelemetry(None, status_every=10.0, clock=clock)
    caplog.set_level("INFO", logger="prism.worker")
    tel.consumed(500)
    tel.outcomes(Counter({"applied": 490, "dlq.unparsable": 7, "quarantine.post_terminal": 3}))
    tel.lag = {0: 120, 1: 80}
    tel.acknowledged([time.time() - 2.0] * 50)
    clock.now += 5
    tel.write_stats()
    assert caplog.messages == []  # not yet: 5 s < 10 s
    clock.now += 5
    tel.write_stats()
    (line,) = caplog.messages
    assert line.startswith("status: consumed 500 events (50/s), lag 200, freshness p99 2.")
    assert "DLQ 7 (unparsable=7), quarantined 3 (post_terminal=3)" in line
    caplog.clear()
    clock.now += 10  # idle: no new events, so no line until six periods have passed
    tel.write_stats()
    assert caplog.messages == []
    clock.now += 50
    tel.write_stats()
    assert caplog.messages and "freshness p99 -" in caplog.messages[0]


def test_stopping_logs_one_summary_line_and_writes_the_stats_file(tmp_path, caplog) -> None:
    clock = Clock()
    stats = tmp_path / "worker-stats.json"
    tel = WorkerTelemetry(stats, clock=clock)
    caplog.set_level("INFO", logger="prism.worker")
    tel.consumed(1200)
    tel.consumed(34)
    tel.outcomes(Counter({"applied": 1200, "duplicate": 30, "dlq.oversized": 4}))
    clock.now += 42.5
    tel.stopped()
    (line,) = caplog.messages
    assert line.startswith(
        "worker stopping: consumed 1,234 events in 2 batches over 42.5s, applied 1,200, "
        "duplicates 30, lag 0"
    )
    assert "DLQ 4 (oversized=4), quarantined 0" in line
    assert json.loads(stats.read_text())["events"] == 1234


def test_a_batchs_parts_are_stages_per_event_in_the_stats_file(otel, tmp_path) -> None:
    _tp, _spans, mp, _reader = otel
    tel = WorkerTelemetry(tmp_path / "worker-stats.json", meter_provider=mp)
    assert tel.stage_us() == {}  # no event yet: nothing per event
    tel.consumed(1_000)
    tel.stage("fetch", 0.002)
    tel.laps("batch", {"step and ledger": 0.05, "the alerter's batch": 0.001})
    tel.laps("batch", {"step and ledger": 0.03})
    tel.laps("tick", {"end offsets": 0.004})
    tel.write_stats()
    stats = json.loads((tmp_path / "worker-stats.json").read_text())
    assert stats["stage_us"] == {
        "batch_step_and_ledger": 80.0,  # 0.08 s over 1,000 events
        "batch_the_alerter_s_batch": 1.0,
        "fetch": 2.0,
        "tick_end_offsets": 4.0,
    }


def test_the_step_thread_reports_its_cpu_time_beside_its_wall_time(tmp_path):
    """``step_thread_cpu`` and ``store_cpu`` are the step thread's own CPU time: beside the
    wall times they say how much of a step was waiting (on ClickHouse, on the interpreter
    lock, on a core the broker held) rather than working. A store that sleeps is all wait."""
    from prism.pipeline.core import InRecord, Intake
    from prism.pipeline.worker._step import StepThread

    tel = WorkerTelemetry(None, meter_provider=MeterProvider())
    step = StepThread(Intake(), lambda _out: time.sleep(0.2), tel, 1 << 20, time.time)
    value = (
        b'{"schema": "prism.agent-event/v1", "eventId": "e1", "runId": "r1", "seq": 0,'
        b' "type": "agent_started", "ts": "2026-12-01T00:00:00Z", "data": {}}'
    )
    step.step({0: [InRecord(value, "t", 0, 0)]}, {}, forwarded=False)
    sec = tel.stage_seconds
    assert set(sec) == {"step_thread", "step_thread_cpu", "store", "store_cpu"}
    assert sec["store"] >= 0.2 and sec["step_thread"] >= sec["store"]
    assert sec["store_cpu"] < sec["store"] - 0.1  # asleep: the wall time went on, the CPU's not
    assert 0 < sec["step_thread_cpu"] <= sec["step_thread"]


def _freshness_count(reader: InMemoryMetricReader) -> int:
    """Values the ``prism.freshness`` histogram recorded so far."""
    return sum(
        point.count
        for rm in reader.get_metrics_data().resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == "prism.freshness"
        for point in m.data.data_points
    )


def test_the_reservoir_keeps_each_value_as_likely_as_any_other_whatever_its_batch() -> None:
    kept: Counter[int] = Counter()
    rng = random.Random(7)
    trials, n, size = 3_000, 100, 10
    for _ in range(trials):
        sample = _Reservoir(size, rng=rng)
        at = 0
        for batch in (1, 40, 3, 50, 6):  # batches of any size, 100 values in all
            sample.add_many([float(i) for i in range(at, at + batch)])
            at += batch
        assert sample.count == n and len(sample.values) == size
        kept.update(int(v) for v in sample.values)
    shares = [kept[i] / trials for i in range(n)]  # 0.1 each; 0.0055 its standard error
    assert min(shares) > 0.075 and max(shares) < 0.125, (min(shares), max(shares))


def test_a_small_batch_counts_for_its_rows_not_for_as_much_as_a_big_one() -> None:
    """The last values, at most 200 of each batch, made 200 late rows half of the sample."""
    sample = _Reservoir(1_000, rng=random.Random(3))
    sample.add_many([1.0] * 5_000)  # one batch of 5,000 rows
    for _ in range(10):
        sample.add_many([9.0] * 20)  # ten of 20 rows: 200 of 5,200, 3.8%
    late = sample.values.count(9.0) / len(sample.values)
    assert 0.02 < late < 0.06, late
    assert sample.count == 5_200


def test_the_reservoir_keeps_everything_until_full_and_refuses_no_room() -> None:
    sample = _Reservoir(5)
    sample.add_many([3.0, 1.0])
    sample.add_many([2.0])
    assert sorted(sample.values) == [1.0, 2.0, 3.0] and sample.count == 3
    with pytest.raises(ValueError, match="at least one value, not 0"):
        _Reservoir(0)


def test_the_freshness_histogram_records_every_tenth_row_across_batches(otel, tmp_path):
    """Not a share of each batch: 100 rows in batches of 3, 7, 90 record 10, as one of 100."""
    _, _, mp, reader = otel
    tel = WorkerTelemetry(None, meter_provider=mp)
    now = time.time()
    for size in (3, 7, 90):
        tel.acknowledged([now - 0.1] * size)
    assert _freshness_count(reader) == 100 // FRESH_STRIDE
    tel.acknowledged([now - 0.1] * 5)  # rows 100-104: row 100 is recorded
    assert _freshness_count(reader) == 100 // FRESH_STRIDE + 1
