"""The worker's self-observability: OpenTelemetry traces and metrics, and a stats file.

Traces: each batch is a span that continues the trace of its first event's producer
(``traceparent`` header) and links to every distinct producing span in the batch (up to
``MAX_LINKS``); the ledger insert is its child span. Metrics: events consumed, applied,
deduplicated, quarantined and dead-lettered by reason, batch sizes, insert latency,
consumer lag, and freshness (now minus event ``ts`` when its row is acknowledged by
ClickHouse). The exporter comes from settings (OTLP endpoint, console, or none); besides
it, every worker keeps its instruments in a Prometheus registry that ``MetricsServer``
serves as ``GET /metrics`` (Prometheus text format) beside ``GET /healthz``.

``worker-stats.json`` in the state directory repeats the headline figures for humans,
healthchecks and the benchmark, rewritten every few seconds and at shutdown. The log gets
the same figures as one status line every ``status_every`` seconds (consumed, rate, lag,
freshness p99 since the previous line, DLQ, quarantine) and one summary line when the
worker stops (``stopped``, called from the app's shutdown hook on SIGTERM/SIGINT).
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import re
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.propagate import extract
from opentelemetry.trace import Link

__all__ = ["MAX_LINKS", "WorkerTelemetry", "configure_exporters", "trace_context_of"]

MAX_LINKS = 128
_RESERVOIR = 20_000
_RECENT = 5_000  # the status line's sample of the rows since the last line
FRESH_STRIDE = 10  # the freshness histogram records one acknowledged row in this many
STATUS_EVERY = 10.0  # seconds between status lines while events flow
_IDLE_EVERY = 6  # an idle worker logs every STATUS_EVERY * _IDLE_EVERY seconds

log = logging.getLogger("prism.worker")


# Metric readers of the configured exporter, added to each worker's own meter provider.
_EXPORT_READERS: list[Any] = []


def configure_exporters(
    exporter: str, endpoint: str | None, service: str = "prism-pipeline"
) -> None:
    """Install the global tracer provider and the metric exporter for ``exporter``.

    ``exporter`` is none, console or otlp. Metrics go to each ``WorkerTelemetry``'s own
    meter provider (Prometheus registry + this exporter), not to a global one.
    """
    if exporter == "none":
        return
    from opentelemetry.sdk.metrics.export import (
        ConsoleMetricExporter,
        PeriodicExportingMetricReader,
    )
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    resource = Resource.create({"service.name": service})
    if exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        base = (endpoint or "http://127.0.0.1:4318").rstrip("/")
        span_exporter: Any = OTLPSpanExporter(endpoint=f"{base}/v1/traces")
        metric_exporter: Any = OTLPMetricExporter(endpoint=f"{base}/v1/metrics")
    else:
        span_exporter, metric_exporter = ConsoleSpanExporter(), ConsoleMetricExporter()
    tp = TracerProvider(resource=resource)
    tp.add_span_processor(BatchSpanProcessor(span_exporter))
    trace.set_tracer_provider(tp)
    _EXPORT_READERS.append(PeriodicExportingMetricReader(metric_exporter))


def _prometheus_provider() -> tuple[Any, Any]:
    """(meter provider, registry): a Prometheus reader on a registry of this worker only."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.resources import Resource
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    readers = [PrometheusMetricReader(registry=registry), *_EXPORT_READERS]
    _EXPORT_READERS.clear()  # a reader belongs to one provider
    resource = Resource.create({"service.name": "prism-pipeline"})
    return MeterProvider(resource=resource, metric_readers=readers), registry


def trace_context_of(traceparents: Iterable[str | None]) -> tuple[Any, list[Link]]:
    """(parent context of the batch span, links to the distinct producing spans)."""
    parent = None
    links: list[Link] = []
    seen: set[str] = set()
    for tp in traceparents:
        if not tp or tp in seen or len(links) >= MAX_LINKS:
            continue
        seen.add(tp)
        ctx = extract({"traceparent": tp})
        span_ctx = trace.get_current_span(ctx).get_span_context()
        if not span_ctx.is_valid:
            continue
        if parent is None:
            parent = ctx
        links.append(Link(span_ctx))
    return parent, links


def _seconds(value: float) -> str:
    """A duration for a log line: 2.3s, 12.5min, 1.8h."""
    if abs(value) < 60:
        return f"{value:.1f}s"
    if abs(value) < 3600:
        return f"{value / 60:.1f}min"
    return f"{value / 3600:.1f}h"


class _Reservoir:
    """A uniform sample of every value added (Li's algorithm L), for percentiles in the
    stats file and the status line: each value is as likely to be kept as any other,
    whatever batch it came in, and the sample costs a few random draws per value kept.

    It kept the last values instead, at most 200 of each batch, so a batch of 3,000 rows
    counted for as much as one of 200. Over all rows of two freshness benchmarks at 5,000
    events/s the p99 was 1,105 and 1,116 ms, and that sample said 1,010 and 1,053. The
    warm-up's 20 rows, acknowledged 4-5 s after they were sent, were 0.1% of the first
    status line's rows but 1% of its sample, and set its p99."""

    def __init__(self, size: int = _RESERVOIR, rng: random.Random | None = None) -> None:
        if size < 1:
            raise ValueError(f"a reservoir holds at least one value, not {size}")
        self.size = size
        self.values: list[float] = []
        self.count = 0  # values added
        self._rng = rng or random.Random()
        self._w = 1.0  # algorithm L's running weight, once the sample is full
        self._next = 0  # the index (over all values added) of the next value kept

    def add_many(self, values: list[float]) -> None:
        start, end = self.count, self.count + len(values)
        self.count = end
        room = self.size - len(self.values)
        if room > 0:  # the first ``size`` values are all kept
            self.values.extend(values[:room])
            if len(self.values) < self.size:
                return
            self._next = self.size - 1
            self._advance()
        rng, size = self._rng, self.size
        while self._next < end:
            self.values[rng.randrange(size)] = values[self._next - start]
            self._advance()

    def _advance(self) -> None:
        """Draw the index of the next value to keep (``_next``) past the current one."""
        rng = self._rng
        self._w *= math.exp(math.log(1.0 - rng.random()) / self.size)
        if self._w >= 1.0:  # ``random()`` returned 0: keep the very next value
            self._next += 1
            return
        self._next += int(math.log(1.0 - rng.random()) / math.log1p(-self._w)) + 1

    def summary(self) -> dict[str, float]:
        if not self.values:
            return {"count": 0}
        ordered = sorted(self.values)

        def q(p: float) -> float:
            return round(ordered[min(len(ordered) - 1, int(p * len(ordered)))], 3)

        return {
            "count": self.count,
            "p50": q(0.5),
            "p90": q(0.9),
            "p99": q(0.99),
            "max": ordered[-1],
        }


class WorkerTelemetry:
    """Spans, OTel instruments and the stats file of one worker process."""

    def __init__(
        self,
        stats_path: Path | None,
        *,
        tracer_provider: Any = None,
        meter_provider: Any = None,
        status_every: float = STATUS_EVERY,
        clock: Any = time.time,
    ) -> None:
        self.tracer = trace.get_tracer("prism.worker", tracer_provider=tracer_provider)
        self.registry: Any = None  # the Prometheus registry /metrics serves
        if meter_provider is None:
            meter_provider, self.registry = _prometheus_provider()
        meter = metrics.get_meter("prism.worker", meter_provider=meter_provider)
        self._consumed = meter.create_counter("prism.events.consumed", unit="{event}")
        self._outcomes = meter.create_counter(
            "prism.events.outcome",
            unit="{event}",
            description="applied, duplicate, quarantine.*, dlq.*",
        )
        self._batch = meter.create_histogram("prism.batch.size", unit="{event}")
        self._insert = meter.create_histogram("prism.ledger.insert.duration", unit="ms")
        self._fresh = meter.create_histogram(
            "prism.freshness",
            unit="ms",
            description="now minus event ts when its row is acknowledged by ClickHouse",
        )
        self.lag: dict[int, int] = {}
        meter.create_observable_gauge(
            "prism.consumer.lag",
            callbacks=[self._observe_lag],
            unit="{record}",
            description="records behind the partition's end offset, per input partition",
        )
        meter.create_observable_gauge(
            "prism.batch.age",
            callbacks=[self._observe_batch_age],
            unit="s",
            description="seconds since the worker last handled a batch (since start before one)",
        )
        self.stopping = False
        self.stats_path = stats_path
        if stats_path is not None:
            stats_path.parent.mkdir(parents=True, exist_ok=True)
        self.counts: Counter[str] = Counter()
        # figures the worker sets itself for the stats file (restores, fenced writes, ...)
        self.extra: dict[str, Any] = {}
        self.freshness = _Reservoir()
        self.insert_ms = _Reservoir(2000)
        self.batch_sizes = _Reservoir(2000)
        self.stage_seconds: defaultdict[str, float] = defaultdict(float)  # ``stage``: seconds
        self.first_batch_at: float | None = None
        self.last_batch_at: float | None = None
        self._last_write = 0.0
        self.status_every = status_every
        self._clock = clock
        self.started_at = clock()
        self._recent_fresh = _Reservoir(_RECENT)  # since the last status line
        self._fresh_skip = 0  # values to pass over before the histogram's next (``acknowledged``)
        self._last_status = (self.started_at, 0)  # (when, events then)

    @contextmanager
    def batch_span(self, size: int, traceparents: Iterable[str | None]) -> Iterator[Any]:
        parent, links = trace_context_of(traceparents)
        with self.tracer.start_as_current_span(
            "prism.worker.batch", context=parent, links=links, attributes={"prism.batch.size": size}
        ) as span:
            yield span

    @contextmanager
    def insert_span(self, rows: int) -> Iterator[None]:
        start = time.perf_counter()
        with self.tracer.start_as_current_span(
            "prism.ledger.insert", attributes={"prism.ledger.rows": rows}
        ):
            yield
        ms = (time.perf_counter() - start) * 1000
        self._insert.record(ms)
        self.insert_ms.add_many([ms])

    def consumed(self, n: int) -> None:
        now = self._clock()
        self.first_batch_at = self.first_batch_at or now
        self.last_batch_at = now
        self.counts["events"] += n
        self.counts["batches"] += 1
        self._consumed.add(n)
        self._batch.record(n)
        self.batch_sizes.add_many([float(n)])

    def stage(self, name: str, seconds: float) -> None:
        """Add ``seconds`` to stage ``name`` (the stats file reports microseconds per event):

        - ``step_thread``: wall time of the step in its thread (parse, run semantics, store);
        - ``store``: the part of it spent in the ledger store (columns, inserts, retries);
        - ``fetch``: the loop's wait for a fetch (at a backlog, what fetching costs);
        - ``batch_<part>``, ``tick_<part>``: the parts of the batches' and ticks' wall time
          (``laps``), each named after its ``Laps`` part.
        """
        self.stage_seconds[name] += seconds

    def laps(self, kind: str, parts: Mapping[str, float]) -> None:
        """Add the parts of a batch's or tick's wall time (``Laps.parts``) as the stages
        ``<kind>_<part>``, the part's name in lower case with ``_`` between its words."""
        for name, seconds in parts.items():
            words = re.findall(r"[a-z0-9]+", name.lower())
            self.stage_seconds["_".join([kind, *words])] += seconds

    def stage_us(self) -> dict[str, float]:
        """Microseconds per consumed event of each stage so far (empty before any event)."""
        events = self.counts["events"]
        if not events:
            return {}
        return {k: round(v / events * 1e6, 3) for k, v in sorted(self.stage_seconds.items())}

    def outcomes(self, stats: Counter[str]) -> None:
        for name, n in stats.items():
            self.counts[name] += n
            self._outcomes.add(n, {"outcome": name})

    def acknowledged(self, event_ts: list[float]) -> None:
        """Rows of events with these ``ts`` (unix s) were just acknowledged by ClickHouse."""
        now = time.time()
        values = [(now - ts) * 1000 for ts in event_ts]
        self.freshness.add_many(values)
        self._recent_fresh.add_many(values)
        # every FRESH_STRIDE-th row across batches, not a share of each batch: a batch of
        # 3,000 rows counted in the histogram for as much as one of 100
        for v in values[self._fresh_skip :: FRESH_STRIDE]:
            self._fresh.record(v)
        self._fresh_skip = (self._fresh_skip - len(values)) % FRESH_STRIDE

    def _observe_lag(self, _options: Any) -> Iterable[metrics.Observation]:
        return [metrics.Observation(v, {"partition": p}) for p, v in self.lag.items()]

    def _observe_batch_age(self, _options: Any) -> Iterable[metrics.Observation]:
        return [metrics.Observation(self._clock() - (self.last_batch_at or self.started_at))]

    # -- /metrics and /healthz ------------------------------------------------------------
    def metrics_text(self) -> bytes:
        """The instruments in the Prometheus text format (empty without a registry)."""
        if self.registry is None:
            return b""
        from prometheus_client import generate_latest

        return bytes(generate_latest(self.registry))

    def health(self) -> tuple[bool, dict[str, Any]]:
        """(healthy, details): healthy until the worker starts stopping."""
        fresh = self.freshness.summary()
        doc = {
            "status": "stopping" if self.stopping else "ok",
            "uptime_s": round(self._clock() - self.started_at, 3),
            "events": self.counts["events"],
            "batches": self.counts["batches"],
            "last_batch_age_s": (
                round(self._clock() - self.last_batch_at, 3) if self.last_batch_at else None
            ),
            "lag": sum(self.lag.values()),
            "freshness_p99_ms": fresh.get("p99"),
        }
        return not self.stopping, doc

    # -- human-readable lines -------------------------------------------------------------
    def _rejected(self, prefix: str) -> dict[str, int]:
        return {
            k.split(".", 1)[1]: v
            for k, v in sorted(self.counts.items())
            if k.startswith(prefix + ".") and v
        }

    @staticmethod
    def _by_reason(counts: dict[str, int]) -> str:
        total = sum(counts.values())
        if not total:
            return "0"
        return f"{total:,} (" + ", ".join(f"{k}={v:,}" for k, v in counts.items()) + ")"

    def status_line(self, now: float | None = None) -> str:
        """One line: consumed, rate since the previous line, lag, freshness p99, DLQ, quarantine."""
        now = self._clock() if now is None else now
        since, events_then = self._last_status
        events = self.counts["events"]
        rate = (events - events_then) / max(now - since, 1e-9)
        recent = sorted(self._recent_fresh.values)
        p99 = "-"
        if recent:
            p99 = _seconds(recent[min(len(recent) - 1, int(0.99 * len(recent)))] / 1000)
        return (
            f"status: consumed {events:,} events ({rate:,.0f}/s), lag {sum(self.lag.values()):,}, "
            f"freshness p99 {p99}, DLQ {self._by_reason(self._rejected('dlq'))}, "
            f"quarantined {self._by_reason(self._rejected('quarantine'))}"
        )

    def maybe_log_status(self) -> bool:
        """Log ``status_line`` when ``status_every`` has passed (less often while idle)."""
        now = self._clock()
        since, events_then = self._last_status
        idle = self.counts["events"] == events_then
        if now - since < self.status_every * (_IDLE_EVERY if idle else 1):
            return False
        log.info("%s", self.status_line(now))
        self._last_status = (now, self.counts["events"])
        self._recent_fresh = _Reservoir(_RECENT)
        return True

    def summary_line(self) -> str:
        """What the worker did since it started, for the line it logs when it stops."""
        fresh = self.freshness.summary()
        freshness = (
            f"freshness p50 {_seconds(fresh['p50'] / 1000)} p99 {_seconds(fresh['p99'] / 1000)}"
            if fresh.get("count")
            else "freshness -"
        )
        return (
            f"consumed {self.counts['events']:,} events in {self.counts['batches']:,} batches "
            f"over {self._clock() - self.started_at:.1f}s, applied {self.counts['applied']:,}, "
            f"duplicates {self.counts['duplicate']:,}, lag {sum(self.lag.values()):,}, "
            f"{freshness}, DLQ {self._by_reason(self._rejected('dlq'))}, "
            f"quarantined {self._by_reason(self._rejected('quarantine'))}"
        )

    def stopped(self) -> None:
        """The worker is shutting down (SIGTERM/SIGINT): write the stats file, log a summary."""
        self.stopping = True
        self.write_stats(force=True)
        log.info("worker stopping: %s", self.summary_line())

    def write_stats(self, *, force: bool = False) -> None:
        """Rewrite ``worker-stats.json`` (at most every 2 s unless ``force``); log status."""
        if not force:
            self.maybe_log_status()
        if self.stats_path is None:
            return
        now = time.time()
        if not force and now - self._last_write < 2.0:
            return
        self._last_write = now
        doc = {
            "pid": os.getpid(),
            "updated_at": now,
            "first_batch_at": self.first_batch_at,
            "last_batch_at": self.last_batch_at,
            "events": self.counts["events"],
            "applied": self.counts["applied"],
            "duplicates": self.counts["duplicate"],
            "batches": self.counts["batches"],
            "rejected": {
                k: v for k, v in self.counts.items() if k.startswith(("dlq.", "quarantine."))
            },
            "freshness_ms": self.freshness.summary(),
            "insert_ms": self.insert_ms.summary(),
            "batch_size": self.batch_sizes.summary(),
            "stage_us": self.stage_us(),
            "lag": sum(self.lag.values()),
            **self.extra,
        }
        tmp = self.stats_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        tmp.replace(self.stats_path)
