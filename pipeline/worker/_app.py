"""The faust-streaming worker: Kafka batches -> the core -> ClickHouse, then output topics.

Per batch (``stream.take_events``): parse the raw values in one call, send bad records to
the DLQ, run each source partition's events through that partition's ``Processor``,
insert the rows into the ledger and wait for ClickHouse's acknowledgement, produce the
quarantine / runs-closed / alert / DLQ records and wait for the broker, then write each
touched run's state once to the ``run-state`` table under that partition's event
context. Only after all of that does the batch's body return, so faust acknowledges (and
later commits) those offsets only once the ledger holds their rows.

Limit deaths go through the single-partition ``<prefix>.limit-deaths`` topic so one
alerter sees every tenant's deaths; each batch also sends its partition watermark there.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import time
import weakref
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any, cast

import faust
import orjson
from faust.streams import _current_event
from faust.types import TP

from prism.schemas import AlertRow, ContractViolation, LedgerBatch, parse_batch

from ..core import (
    Delivery,
    ExhaustionAlerter,
    LimitDeath,
    Output,
    OutRecord,
    Processor,
    alert_record,
)
from ..ingest import dead_letter_row
from ..settings import Settings
from ._faust import make_app
from ._offsets import ReadBack, Rec, missing_ranges, rec_of_message
from ._records import core_config, dlq_record, header, lag, source_range
from ._telemetry import WorkerTelemetry

__all__ = ["AlertSink", "PipelineWorker", "core_config"]

log = logging.getLogger("prism.worker")

AlertSink = Callable[[list[AlertRow]], Awaitable[None]]
_ALERTER_KEY = b"alerter"


class PipelineWorker:
    """The faust app with its agents, plus the ledger writer it feeds.

    ``writer`` is a ``sinks.LedgerWriter`` (``add``/``flush``); ``alert_sinks`` receive the
    alerts raised (e.g. the webhook notifier).
    """

    def __init__(
        self,
        settings: Settings,
        writer: Any,
        *,
        alert_sinks: Sequence[AlertSink] = (),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.config = core_config(settings)
        self.writer = writer
        self.alert_sinks = list(alert_sinks)
        self.clock = clock
        self.topics = settings.topics
        self.app: faust.App = make_app(settings)
        raw: dict[str, Any] = {
            "key_type": bytes,
            "value_type": bytes,
            "key_serializer": "raw",
            "value_serializer": "raw",
        }
        self.input = self.app.topic(self.topics.input, partitions=settings.partitions, **raw)
        self.deaths = self.app.topic(f"{settings.topic_prefix}.limit-deaths", partitions=1, **raw)
        self.outputs = {
            name: self.app.topic(topic, partitions=settings.partitions, **raw)
            for name, topic in (
                ("dlq", self.topics.dlq),
                ("quarantine", self.topics.quarantine),
                ("closed", self.topics.runs_closed),
                ("alerts", self.topics.alerts),
            )
        }
        # bytes key/value types make faust use the raw codec for the changelog as well
        table: dict[str, Any] = {"default": None, "key_type": bytes, "value_type": bytes}
        self.state = self.app.Table("run-state", partitions=settings.partitions, **table)
        self.alert_state = self.app.Table("alert-state", partitions=1, **table)
        self.processors: dict[int, Processor] = {}
        self.read_back = ReadBack(self.topics.input, settings.aiokafka_kwargs())
        self.last_event: dict[int, Any] = {}
        self.alerter: ExhaustionAlerter | None = None
        self.stats: Counter[str] = Counter()
        self._ledger_lock = asyncio.Lock()
        self.telemetry = WorkerTelemetry(settings.state_dir / "worker-stats.json")
        atexit.register(self.telemetry.write_stats, force=True)
        self._last_log = 0.0
        # take_events is on the concrete Stream, not on the StreamT protocol faust types with
        self.app.agent(self.input, name="prism-events")(cast(Any, self._events_agent))
        self.app.agent(self.deaths, name="prism-limit-deaths")(cast(Any, self._deaths_agent))
        self.app.timer(interval=max(1.0, settings.batch_max_seconds))(self._tick)
        self.app.on_partitions_revoked.connect(cast(Any, self._on_revoked))
        self.app.on_before_shutdown.connect(cast(Any, self._on_shutdown))

    # -- agents -------------------------------------------------------------------------
    async def _events_agent(self, stream: faust.Stream) -> None:
        s = self.settings
        async for events in stream.take_events(s.batch_max_events, s.batch_max_seconds):
            await self.handle_batch(events)

    async def handle_batch(self, events: Sequence[Any]) -> None:
        self.telemetry.consumed(len(events))
        traceparents = [header(e.message.headers, "traceparent") for e in events]
        with self.telemetry.batch_span(len(events), traceparents):
            await self._handle_batch(events, traceparents)

    async def _handle_batch(self, events: Sequence[Any], traceparents: list[str | None]) -> None:
        now = self.clock()
        received = datetime.fromtimestamp(now, tz=UTC)
        by_partition: dict[int, list[Rec]] = defaultdict(list)
        for ev in events:
            by_partition[ev.message.partition].append(rec_of_message(ev.message))
            self.last_event[ev.message.partition] = ev
        outputs: list[tuple[int, Output, Any]] = []
        dlq: list[OutRecord] = []
        event_ts: list[float] = []
        for partition, recs in sorted(by_partition.items()):
            proc = self._processor(partition)
            recs = await self._without_gaps(proc, partition, recs)
            out = Output()
            deliveries = []
            parsed = parse_batch([r.value for r in recs], max_bytes=self.settings.max_event_bytes)
            for rec, item in zip(recs, parsed, strict=True):
                if isinstance(item, ContractViolation):
                    out.ledger.dead_letters.append(
                        dead_letter_row(
                            rec.value or b"", item, rec.topic, partition, rec.offset, received
                        )
                    )
                    dlq.append(dlq_record(rec, item))
                    out.stats[f"dlq.{item.code}"] += 1
                else:
                    traceparent = header(rec.headers, "traceparent")
                    deliveries.append(
                        Delivery(item, rec.topic, partition, rec.offset, received, traceparent)
                    )
                    event_ts.append(item.ts.timestamp())
            first, last = min(r.offset for r in recs), max(r.offset for r in recs)
            proc.next_offset = max(proc.next_offset or 0, last + 1)
            out.extend(proc.process(deliveries, now))
            self.telemetry.lag[partition] = lag(self.app, TP(self.topics.input, partition), last)
            outputs.append(
                (partition, out, source_range(self.topics.input, partition, first, last))
            )
        await self._commit_outputs(outputs, dlq, event_ts)

    async def _without_gaps(self, proc: Processor, partition: int, recs: list[Rec]) -> list[Rec]:
        """The batch's records plus any offsets the consumer skipped, read back, in order."""
        gaps = missing_ranges(proc.next_offset, (r.offset for r in recs))
        if not gaps:
            return recs
        found = await self.read_back.read(partition, gaps)
        skipped = sum(end - start for start, end in gaps)
        self.stats["offsets_read_back"] += len(found)
        log.warning(
            "partition %d: the consumer skipped %d offset(s) %s; read back %d record(s)",
            partition,
            skipped,
            ", ".join(f"{a}..{b - 1}" for a, b in gaps[:5]),
            len(found),
        )
        merged = {r.offset: r for r in found}
        merged.update((r.offset, r) for r in recs)
        return [merged[o] for o in sorted(merged)]

    async def _commit_outputs(
        self,
        outputs: list[tuple[int, Output, Any]],
        dlq: list[OutRecord],
        event_ts: list[float] | None = None,
    ) -> None:
        """Ledger first (and wait), then topics (and wait), then state: offsets rely on it."""
        await self._write_ledger([(out.ledger, rng) for _, out, rng in outputs])
        if event_ts:
            self.telemetry.acknowledged(event_ts)
        futures = [self._send("dlq", r) for r in dlq]
        for partition, out, _ in outputs:
            futures += [self._send("quarantine", r) for r in out.quarantined]
            futures += [self._send("closed", r) for r in out.closed]
            futures += [self._send("alerts", r) for r in out.alerts]
            for death in out.limit_deaths:
                futures.append(self._send_death(death))
            futures.append(self._send_watermark(partition, self.processors[partition].watermark_us))
            self.stats.update(out.stats)
            self.telemetry.outcomes(out.stats)
        await asyncio.gather(*[await f for f in futures])
        for partition, out, _ in outputs:
            self._write_state(partition, out.state_writes)
            if out.ledger.alerts:
                await self._notify(out.ledger.alerts)
        self._log_summary()
        self.telemetry.write_stats()

    async def _write_ledger(self, parts: list[tuple[LedgerBatch, Any]]) -> None:
        """Insert and wait for the acknowledgement; while ClickHouse fails, retry, hold offsets."""
        from prism.sinks import LedgerWriteError

        parts = [(b, r) for b, r in parts if len(b)]
        if not parts:
            return
        async with self._ledger_lock:
            for batch, rng in parts:
                self.writer.add(batch, rng)
            delay = 0.5
            while True:
                try:
                    with self.telemetry.insert_span(sum(len(b) for b, _ in parts)):
                        await asyncio.to_thread(self.writer.flush)
                    return
                except LedgerWriteError as exc:
                    self.stats["ledger_write_failures"] += 1
                    log.warning(
                        "ledger write failed, offsets held, retrying in %.1fs: %s", delay, exc
                    )
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 30.0)

    # -- the alerter --------------------------------------------------------------------
    async def _deaths_agent(self, stream: faust.Stream) -> None:
        async for events in stream.take_events(1000, 0.5):
            alerter = self._alerter()
            deaths, wm = [], 0
            for ev in events:
                d = orjson.loads(ev.message.value or b"{}")
                if "wm" in d:
                    wm = max(wm, d["wm"])
                else:
                    deaths.append(
                        LimitDeath(
                            d["tenantId"], d["axis"], d["runId"], datetime.fromisoformat(d["ts"])
                        )
                    )
            rows = alerter.observe(deaths) + alerter.advance(wm)
            if rows:
                batch = LedgerBatch(alerts=rows)
                await self._write_ledger(
                    [
                        (
                            batch,
                            source_range(
                                self.deaths.get_topic_name(),
                                0,
                                events[0].message.offset,
                                events[-1].message.offset,
                            ),
                        )
                    ]
                )
                await asyncio.gather(*[await self._send("alerts", alert_record(r)) for r in rows])
                await self._notify(rows)
            token = _current_event.set(weakref.ref(events[-1]))
            try:
                self.alert_state[_ALERTER_KEY] = alerter.to_bytes()
            finally:
                _current_event.reset(token)

    def _alerter(self) -> ExhaustionAlerter:
        if self.alerter is None:
            raw = self.alert_state.get(_ALERTER_KEY)
            self.alerter = (
                ExhaustionAlerter.from_bytes(raw)
                if raw
                else ExhaustionAlerter(self.config.alert_window_s, self.config.alert_threshold)
            )
        return self.alerter

    async def _notify(self, rows: list[AlertRow]) -> None:
        for sink in self.alert_sinks:
            try:
                await sink(rows)
            except Exception:  # a notifier must never stop the stream
                log.exception("alert sink %r failed", sink)

    # -- partitions and state -----------------------------------------------------------
    def _processor(self, partition: int) -> Processor:
        proc = self.processors.get(partition)
        if proc is None:
            proc = Processor(self.config, partition)
            proc.load(
                (k.decode(), v)
                for k, v in self.state.items()
                if v is not None and proc.owns_key(k.decode())
            )
            self.processors[partition] = proc
            log.info("partition %d: restored %d runs", partition, len(proc.runs))
        return proc

    def _write_state(self, partition: int, writes: dict[str, bytes | None]) -> None:
        token = _current_event.set(weakref.ref(self.last_event[partition]))
        try:
            for key, value in writes.items():
                if value is None:
                    self.state.pop(key.encode(), None)
                else:
                    self.state[key.encode()] = value
        finally:
            _current_event.reset(token)

    async def _on_shutdown(self, app: Any, **_: Any) -> None:
        """The consumer has stopped: let notifiers deliver what they queued, write stats."""
        for sink in self.alert_sinks:
            aclose = getattr(sink, "aclose", None)
            if aclose is not None:
                try:
                    await aclose(timeout=5.0)
                except Exception:
                    log.exception("closing alert sink %r failed", sink)
        self.telemetry.write_stats(force=True)
        await self.read_back.close()

    async def _on_revoked(self, app: Any, revoked: set[Any], **_: Any) -> None:
        for tp in revoked:
            if tp.topic == self.topics.input:
                self.processors.pop(tp.partition, None)
                self.last_event.pop(tp.partition, None)

    async def _tick(self) -> None:
        """Grace periods in processing time for partitions that went quiet."""
        now = self.clock()
        outputs = []
        for partition, proc in list(self.processors.items()):
            if partition not in self.last_event:
                continue
            out = proc.tick(now)
            if out.closed or out.ledger.runs or out.ledger.alerts:
                offset = self.last_event[partition].message.offset
                outputs.append(
                    (
                        partition,
                        out,
                        source_range("tick:" + self.topics.input, partition, offset, offset),
                    )
                )
        if outputs:
            await self._commit_outputs(outputs, [])
        self.telemetry.write_stats()

    # -- producing ----------------------------------------------------------------------
    async def _send(self, name: str, rec: OutRecord) -> Awaitable[Any]:
        return await self.app.producer.send(
            self.outputs[name].get_topic_name(),
            rec.key,
            rec.value,
            None,
            None,
            list(rec.headers) or None,
        )

    async def _send_death(self, death: LimitDeath) -> Awaitable[Any]:
        value = orjson.dumps(
            {
                "tenantId": death.tenant_id,
                "axis": death.axis,
                "runId": death.run_id,
                "ts": death.ts.isoformat(),
            }
        )
        return await self.app.producer.send(
            self.deaths.get_topic_name(),
            f"{death.tenant_id}|{death.axis}".encode(),
            value,
            0,
            None,
            None,
        )

    async def _send_watermark(self, partition: int, wm_us: int) -> Awaitable[Any]:
        return await self.app.producer.send(
            self.deaths.get_topic_name(),
            b"wm",
            orjson.dumps({"wm": wm_us, "p": partition}),
            0,
            None,
            None,
        )

    def _log_summary(self) -> None:
        now = time.monotonic()
        if now - self._last_log >= 30:
            self._last_log = now
            bad = {k: v for k, v in self.stats.items() if k.startswith(("dlq.", "quarantine."))}
            log.info(
                "applied=%d duplicates=%d closed=%d rejected=%s",
                self.stats["applied"],
                self.stats["duplicate"],
                self.stats["closed"],
                bad or "none",
            )
