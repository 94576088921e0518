"""The one intake step every shell calls: records in; dead letters, rows and records out.

::

    InRecord (Kafka record or file line)
      -> parse (one call, dispatching on ``schema``)  --invalid-->  dead letter
      -> Delivery -> Processor.process (this partition's run semantics)
                  -> ChannelProcessor.process (its channel-operation semantics)
                      --raises--> bisect to the record: dead letter ``internal_error``
      -> ExhaustionAlerter (when the intake owns one: files and rebuilds)
      -> Output

The worker, ``ingest-file``, ``rebuild`` and the tests all go through ``Intake.step``;
``store_isolating`` adds rule 15's answer to a store that refuses rows for good: undo the
step, find the poison records by bisection, dead-letter them as ``unstorable``, store the
rest. Every input record thus ends in exactly one of the ledger, quarantine or the DLQ.

An intake that routes (``route_partitions``, the worker's) applies a parsed record only
on its home partition (``_route.home_partition`` of its routing key): one found on another
partition becomes a ``Forward`` for the repartition topic instead, and its copy, stepped
on the home lane with ``forwarded=True``, ends in one of the three there. So every run
(and channel operation) is judged by one lane, whatever its producer's key
(schemas/CONTRACT.md, "Transport" and rule 15). The shell tells the intake which of a
lane's two sources have records waiting (``behind``) and the earliest event time of the
copies it produced that are not applied yet (``hold``): a step that forwards holds the
copies' home at their time itself, so nothing (grace, staleness, an alert) is decided past
a copy still on its way.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from prism.schemas import (
    CHANNEL_SCHEMA_ID,
    MAX_EVENT_BYTES,
    ChannelOperation,
    ContractViolation,
    DeadLetterRow,
    FastEvent,
    dead_letter_preview,
    parse_any_batch,
    parse_fast_batch,
)

from ._alerts import ExhaustionAlerter, alert_record
from ._channels import ChannelProcessor
from ._processor import Processor
from ._route import forward_of
from ._types import (
    CoreConfig,
    Delivery,
    EventClock,
    Forward,
    LaneReport,
    Output,
    OutRecord,
    forwarded_lane,
    lane_of_forwarded,
)

__all__ = [
    "InRecord",
    "Intake",
    "PermanentStoreError",
    "dead_letter_row",
    "dlq_record",
    "store_isolating",
]

log = logging.getLogger("prism.core")

MAX_REASON_CHARS = 500
_CHANNEL_MARK = CHANNEL_SCHEMA_ID.encode()


@dataclass(slots=True)
class InRecord:
    """One input record: a Kafka record (topic, partition, offset) or a file line (-1, line).

    ``source`` names the topic (or file); ``key`` is the Kafka record key as produced.
    """

    value: bytes | None
    source: str
    partition: int
    offset: int
    key: bytes | None = None
    traceparent: str | None = None


class PermanentStoreError(Exception):
    """A store refused rows for good (bad data, not a passing fault): isolate, don't retry."""


def dead_letter_row(rec: InRecord, code: str, reason: str, received_at: datetime) -> DeadLetterRow:
    """The ledger row of a record that was dead-lettered (original bytes stay on the DLQ):
    its size, hash and a redacted preview (SECURITY.md)."""
    kept = dead_letter_preview(rec.value or b"")
    return DeadLetterRow(
        source=rec.source,
        partition=rec.partition,
        offset=rec.offset,
        code=code,
        reason=reason[:MAX_REASON_CHARS],
        size=kept.size,
        sha256=kept.sha256,
        preview=kept.preview,
        received_at=received_at,
    )


def dlq_record(rec: InRecord, code: str, reason: str) -> OutRecord:
    """The DLQ topic record: original key and bytes, reason and source position in headers."""
    return OutRecord(
        key=rec.key or b"",
        value=rec.value or b"",
        headers=(
            ("reason", reason[:MAX_REASON_CHARS].encode()),
            ("reason-code", code.encode()),
            ("source-topic", rec.source.encode()),
            ("source-partition", str(rec.partition).encode()),
            ("source-offset", str(rec.offset).encode()),
        ),
    )


class Intake:
    """Parse, dead-letter, apply run semantics per partition, raise exhaustion alerts.

    One ``EventClock`` is shared by every partition's processor: the pipeline-wide
    watermark of rule 10. ``alerter``: the intake raises exhaustion alerts itself (a file
    or a rebuild); the worker leaves it None and routes limit deaths to its one alerter.
    ``route_partitions``: the input topic's partition count, to bring each record to its
    run's home partition (``Output.forwards``); None (files, rebuilds) applies every record
    where it arrives. ``channel_partitions``: the same for channel operations (default
    ``route_partitions``), whose home partition ``p`` is lane ``channel_lane + p`` (the
    worker numbers them apart from the agent-event lanes; 0: the same lane).

    Example::

        intake = Intake(CoreConfig(processing_grace=False))
        out = intake.step(-1, [InRecord(line, "file:fleet.jsonl", -1, 1)], now=time.time())
        out.ledger.runs, out.dlq, out.quarantined
    """

    def __init__(
        self,
        config: CoreConfig | None = None,
        *,
        max_event_bytes: int = MAX_EVENT_BYTES,
        alerter: ExhaustionAlerter | None = None,
        route_partitions: int | None = None,
        channel_partitions: int | None = None,
        channel_lane: int = 0,
    ) -> None:
        for name, count in (("route_partitions", route_partitions),
                            ("channel_partitions", channel_partitions)):  # fmt: skip
            if count is not None and count < 1:
                raise ValueError(f"Intake {name} must be a partition count >= 1, got {count}")
        self.route_partitions = route_partitions
        self.channel_partitions = (
            route_partitions if channel_partitions is None else channel_partitions
        )
        if channel_lane < 0:
            raise ValueError(f"Intake channel_lane must be a lane number >= 0, got {channel_lane}")
        self.channel_lane = channel_lane
        self.config = config or CoreConfig()
        self.max_event_bytes = max_event_bytes
        self.clock = EventClock(self.config.max_clock_skew_s)
        self.alerter = alerter
        self._alerter_undo: bytes | None = None  # the alerter before the open steps
        self.processors: dict[int, Processor] = {}
        self.channels: dict[int, ChannelProcessor] = {}
        self.generations: dict[int, int] = {}  # lane -> its owner generation (row versions)
        self.ticked_at: dict[int, float] = {}  # lane -> ``now`` of its last step or tick
        # parse_ahead's results, by the identity of the value parsed: (that value, result)
        self._ahead: dict[int, tuple[bytes, Any]] = {}
        self.ahead_used = 0  # values a step took from parse_ahead instead of parsing them

    def processor(self, partition: int) -> Processor:
        """The partition's processor (created empty; ``Processor.load`` restores state)."""
        proc = self.processors.get(partition)
        if proc is None:
            proc = self.processors[partition] = Processor(self.config, partition, self.clock)
            proc.generation = self.generations.get(partition, 0)
        return proc

    def channel_processor(self, partition: int) -> ChannelProcessor:
        """The partition's channel-operation processor (created empty)."""
        proc = self.channels.get(partition)
        if proc is None:
            proc = ChannelProcessor(self.config, partition, self.clock)
            proc.generation = self.generations.get(partition, 0)
            self.channels[partition] = proc
        return proc

    def lane(self, partition: int) -> list[Processor | ChannelProcessor]:
        """The partition's processors that exist (run semantics first, then channels)."""
        procs: list[Processor | ChannelProcessor] = []
        if partition in self.processors:
            procs.append(self.processors[partition])
        if partition in self.channels:
            procs.append(self.channels[partition])
        return procs

    def next_offset(self, partition: int, source: str | None = None) -> int | None:
        """The next offset the partition expects from ``source`` (a topic name; None: the
        highest over its sources, the answer for a lane with one); None: nothing seen yet."""
        procs = self.lane(partition)
        if source is None:
            offsets = [p.next_offset for p in procs if p.next_offset is not None]
        else:
            offsets = [p.offsets[source] for p in procs if source in p.offsets]
        return max(offsets) if offsets else None

    def load(
        self, partition: int, items: Iterable[tuple[str, bytes]], source: str | None = None
    ) -> None:
        """Restore a partition's state (``Output.state_writes``) into the processors it has
        keys for; the run-semantics processor always exists afterwards. ``source``: the input
        topic that a state stored before offsets were kept per source was read from."""
        items = list(items)
        self.processor(partition).load(items, source)
        probe = ChannelProcessor(self.config, partition, EventClock())
        if any(probe.owns_key(k) for k, _ in items):
            self.channel_processor(partition).load(items, source)

    def set_generation(self, partition: int, generation: int) -> None:
        """The generation of the lane's owner, above every earlier owner's: its rows'
        versions carry it (``KeyedProcessor.row_version``). Files and rebuilds keep 0."""
        self.generations[partition] = generation
        for proc in self.lane(partition):
            proc.generation = generation

    def drop(self, partition: int) -> None:
        """Forget a partition (revoked from this worker). A hold this process set for
        copies it forwarded there stays: they are still on their way to its next owner."""
        self.generations.pop(partition, None)
        self.processors.pop(partition, None)
        self.channels.pop(partition, None)
        self.ticked_at.pop(partition, None)
        self.clock.forget(partition)
        copies = forwarded_lane(partition)
        held = self.clock.held(copies)
        self.clock.forget(copies)
        if held is not None:
            self.clock.hold(copies, held)

    def hold(self, partition: int, ts_us: int | None) -> None:
        """The earliest event time of the forwarded copies still on their way to the
        partition's repartition partition (None: none): the watermark stays at it until
        they are applied. A step that forwards lowers it itself (on the copy's lane,
        ``home_lane``); the shell sets it for the copies a restored slot's last owner left
        in flight (``Forward.ts_us``, kept with the slot's position) and releases it once
        they were applied, as ``behind(partition, False, forwarded=True)`` does."""
        self.clock.hold(forwarded_lane(partition), ts_us)

    def held(self, partition: int) -> int | None:
        """The time ``hold`` holds the partition's copies at (None: none)."""
        return self.clock.held(forwarded_lane(partition))

    def behind(self, partition: int, behind: bool, *, forwarded: bool = False) -> None:
        """Whether the partition's input (``forwarded``: its repartition partition) still
        has records waiting: its mark then holds the watermark back (``EventClock.behind``).

        Nothing waiting on the repartition partition also releases ``hold``: say so only
        from a position measured after the copies forwarded so far were produced (their
        transaction committed), or a copy still on its way is no longer held for.
        """
        key = forwarded_lane(partition) if forwarded else partition
        self.clock.behind(key, behind)
        if forwarded and not behind:
            self.clock.hold(key, None)

    def step(
        self, partition: int, records: Sequence[InRecord], now: float, *, forwarded: bool = False
    ) -> Output:
        """Run ``records`` (one source partition's, in offset order) through the core.

        ``forwarded``: the records come from the repartition topic, already on their home
        lane: they are applied, never forwarded again. The step stays open until
        ``commit(partition)`` (its output was stored) or ``rollback(partition)`` (it was
        not, and is undone).
        """
        received = datetime.fromtimestamp(now, tz=UTC)
        out = Output()
        pairs: list[tuple[InRecord, Delivery[Any]]] = []
        channel: list[tuple[InRecord, Delivery[Any]]] = []
        route = self.route_partitions is not None and not forwarded
        for rec, item in zip(records, self._parse(records), strict=True):
            if isinstance(item, ContractViolation):
                self._dead_letter(out, rec, item.code, item.reason, received)
                continue
            if route and self._forward(out, rec, item):
                continue
            delivery = Delivery(item, rec.source, rec.partition, rec.offset, received)
            delivery.traceparent = rec.traceparent
            # an agent event parsed fast needs no isinstance of a pydantic model (~800
            # instructions through its metaclass): most records are one
            is_channel = type(item) is not FastEvent and isinstance(item, ChannelOperation)
            (channel if is_channel else pairs).append((rec, delivery))
        if pairs or partition not in self.channels:
            self.processor(partition)
        if channel:
            self.channel_processor(partition)
        procs = self.lane(partition)
        mark_key = forwarded_lane(partition) if forwarded else partition
        for proc in procs:
            proc.begin()
            proc.mark_key = mark_key  # copies move a mark of their own
        if records:
            first, last = min(r.offset for r in records), max(r.offset for r in records)
            for proc in procs:
                proc.advance(records[0].source, last + 1)
            out.ranges.append((records[0].source, partition, first, last))
        if partition in self.processors:
            out.extend(self._apply(self.processors[partition], pairs, now, received))
        if channel:
            out.extend(self._apply(self.channels[partition], channel, now, received))
        for proc in procs:
            proc.mark_key = partition
        if channel or partition not in self.channels:  # each processor of the lane ticked
            self.ticked_at[partition] = now
        self._alerts(out)
        return out

    def commit(self, partitions: int | Iterable[int]) -> None:
        """The open ``step`` (or ``tick``) of these partitions was stored: keep it."""
        for p in [partitions] if isinstance(partitions, int) else list(partitions):
            for proc in self.lane(p):
                proc.commit()
        self._alerter_undo = None

    def rollback(self, partitions: int | Iterable[int]) -> None:
        """Undo the open ``step`` (or ``tick``) of these partitions; its output is void."""
        for p in reversed([partitions] if isinstance(partitions, int) else list(partitions)):
            for proc in reversed(self.lane(p)):
                proc.rollback()
        if self._alerter_undo is not None:  # what the undone steps told it is void too
            self.alerter = ExhaustionAlerter.from_bytes(self._alerter_undo)
            self._alerter_undo = None

    def unstorable(
        self, rec: InRecord, reason: str, now: float, partition: int | None = None
    ) -> Output:
        """Dead-letter one record the ledger refused for good; the partition moves past it.

        ``partition``: the intake partition the record was stepped in (default: its own).
        """
        lane = rec.partition if partition is None else partition
        out = Output()
        for proc in self.lane(lane) or [self.processor(lane)]:
            proc.advance(rec.source, rec.offset + 1)
        self._dead_letter(out, rec, "unstorable", reason, datetime.fromtimestamp(now, tz=UTC))
        out.ranges.append((rec.source, lane, rec.offset, rec.offset))
        return out

    def tick(
        self,
        now: float,
        quiet_for: float = 0.0,
        busy: Collection[int] = (),
        held: Collection[int] | None = None,
    ) -> dict[int, Output]:
        """Let processing time pass on every partition (grace periods of quiet partitions).

        ``quiet_for``: only partitions not stepped or ticked in the last ``quiet_for``
        seconds (a step ticks its partition's processors itself, with the same ``now``);
        ``busy``: partitions with input waiting, whose next step ticks them anyway;
        ``held``: only these (a worker's lanes it may commit for; None: all).
        Like ``step``, each partition's tick stays open until ``commit`` or ``rollback``.
        """
        outs = {}
        for p in self.quiet(now, quiet_for, busy):
            if held is not None and p not in held:
                continue
            self.ticked_at[p] = now
            outs[p] = Output()
            for proc in self.lane(p):
                proc.begin()
                outs[p].extend(proc.tick(now))
        for out in outs.values():
            self._alerts(out)
        return outs

    def quiet(self, now: float, quiet_for: float = 0.0, busy: Collection[int] = ()) -> list[int]:
        """The partitions not in ``busy`` and not stepped or ticked in the last ``quiet_for``
        seconds, in order."""
        lanes = sorted((set(self.processors) | set(self.channels)) - set(busy))
        if not quiet_for:
            return lanes
        return [p for p in lanes if now - self.ticked_at.get(p, -math.inf) >= quiet_for]

    def finalize(self, now: float) -> Output:
        """End of input: close what waits on grace, apply staleness, on every partition."""
        out = Output()
        for p in sorted(set(self.processors) | set(self.channels)):
            for proc in self.lane(p):
                out.extend(proc.finalize(now))
        self._alerts(out, final=True)
        return out

    def settle_alerts(self) -> Output:
        """End of input for the intake's own alerter: decide up to the watermark."""
        out = Output()
        self._alerts(out, final=True)
        return out

    def sent_hold(self) -> int | None:
        """The earliest event time of the copies this process forwarded (or took over from
        a slot's last owner) and has not seen applied yet, whichever lane is their home;
        its lane reports carry it (``LaneReport.hold_us``), so the process that holds
        their home lane does not decide past them either. That includes homes held here:
        if this process dies first, their next owner restores a position record that may
        predate the forward, and only these reports say a copy of that time is coming."""
        times = [ts for key, ts in self.clock.holds().items() if lane_of_forwarded(key) is not None]
        return min(times, default=None)

    def lane_report(
        self, partition: int, *, idle: bool, quiet: bool = False, hold_us: int | None = None
    ) -> LaneReport:
        """The partition's event-time report for the alerter (rule 16).

        ``idle``: nothing waits on its input. A lane that also reads forwarded copies
        (``behind(..., forwarded=True)``) is idle when neither waits; else its mark is the
        lowest of the marks of the sources with records waiting.
        """
        proc = self.processors.get(partition)
        pending = None if proc is None else proc.pending_terminal_us()
        mark = self.clock.mark(partition)
        copies = forwarded_lane(partition)
        coming = self.clock.held(copies)  # a copy on its way may close a run at its time
        if coming is not None:
            pending = coming if pending is None else min(pending, coming)
        if self.clock.has_mark(copies) or self.clock.is_behind(copies):
            copies_idle = not self.clock.is_behind(copies)
            if idle and copies_idle:
                mark = max(mark, self.clock.mark(copies))
            elif idle or not copies_idle:
                mark = self.clock.mark(copies) if idle else min(mark, self.clock.mark(copies))
            idle, quiet = idle and copies_idle, quiet and copies_idle
        return LaneReport(mark, pending, idle, quiet, hold_us)

    def parse_ahead(
        self,
        values: Iterable[bytes | None],
        slice_size: int = 0,
        between: Callable[[], object] = lambda: None,
        stop: Callable[[], bool] = lambda: False,
    ) -> int:
        """Parse now the values a coming step is expected to take; return how many.

        Parsing is a function of the value's bytes alone, so it may run before the step,
        in another thread: the worker parses the next batch while this batch's insert
        waits on ClickHouse without the GIL. A step takes each result at most once, matched
        by the identity of the value (the same bytes object), and parses every other value
        as usual: one read back, re-delivered, stepped again in a bisection, or not parsed
        ahead yet. Each call replaces what the last one left, so at most one batch's results
        are held. ``slice_size``: parse that many values at a time, publishing each slice's
        results and calling ``between()`` after it; ``stop()`` true ends the parse there
        (the step has begun and parses the rest itself).
        """
        kept = [v for v in values if v]
        step = slice_size or len(kept) or 1
        ahead: dict[int, tuple[bytes, Any]] = {}
        self._ahead = ahead
        for i in range(0, len(kept), step):
            if stop():
                break
            part = kept[i : i + step]
            items = self._parse_values(part)
            ahead.update((id(v), (v, item)) for v, item in zip(part, items, strict=True))
            between()
        return len(ahead)

    # -- internals ----------------------------------------------------------------------
    def _parse(self, records: Sequence[InRecord]) -> list[Any]:
        """Every record's parse: ``parse_ahead``'s result where it has one, else parsed now."""
        values = [r.value or b"" for r in records]
        ahead = self._ahead
        if not ahead:
            return self._parse_values(values)
        out: list[Any] = [None] * len(values)
        missed: list[int] = []
        for i, value in enumerate(values):
            hit = ahead.pop(id(value), None)
            if hit is not None and hit[0] is value:
                out[i] = hit[1]
            else:
                missed.append(i)
        self.ahead_used += len(values) - len(missed)
        if missed:
            parsed = self._parse_values([values[i] for i in missed])
            for i, item in zip(missed, parsed, strict=True):
                out[i] = item
        return out

    def _parse_values(self, values: list[bytes]) -> list[Any]:
        """Parse every value; only values naming the channel family take the dispatching
        parser, so agent events keep the fast path (``parse_fast_batch``: a ``FastEvent``
        where msgspec accepts the value, ``parse_batch``'s result where it declines)."""
        marked = [i for i, v in enumerate(values) if _CHANNEL_MARK in v]
        if not marked:
            return parse_fast_batch(values, max_bytes=self.max_event_bytes)
        chosen = set(marked)
        rest = [i for i in range(len(values)) if i not in chosen]
        out: list[Any] = [None] * len(values)
        for i, item in zip(
            rest, parse_fast_batch([values[i] for i in rest], self.max_event_bytes), strict=True
        ):
            out[i] = item
        for i, parsed in zip(
            marked, parse_any_batch([values[i] for i in marked], self.max_event_bytes), strict=True
        ):
            out[i] = parsed
        return out

    def _apply(
        self,
        proc: Any,
        pairs: list[tuple[InRecord, Delivery[Any]]],
        now: float,
        received: datetime,
    ) -> Output:
        """``proc.process``; an exception is isolated to its event by bisection (rule 15)."""
        proc.begin()
        try:
            out = proc.process([d for _, d in pairs], now)
        except Exception as exc:
            proc.rollback()
            if len(pairs) == 1:
                rec = pairs[0][0]
                log.exception(
                    "the run semantics failed on %s:%d offset %d; dead-lettered as internal_error",
                    rec.source,
                    rec.partition,
                    rec.offset,
                )
                out = Output()
                reason = f"the pipeline failed to process this event: {type(exc).__name__}: {exc}"
                self._dead_letter(out, rec, "internal_error", reason, received)
                return out
            mid = len(pairs) // 2
            out = self._apply(proc, pairs[:mid], now, received)
            out.extend(self._apply(proc, pairs[mid:], now, received))
            return out
        proc.commit()
        return out

    def _forward(self, out: Output, rec: InRecord, item: Any) -> bool:
        """Forward a parsed record found off its home partition; whether it was."""
        f = forward_of(rec, item, self.route_partitions, self.channel_partitions)
        if f is None:
            return False
        out.forwards.append(f)
        lane = forwarded_lane(self.home_lane(f))  # the copy is on its way to that lane
        held = self.clock.held(lane)
        self.clock.hold(lane, f.ts_us if held is None else min(held, f.ts_us))
        out.forwarded[rec.partition] += 1
        out.patterns[f.pattern] += 1
        out.stats["forwarded"] += 1
        return True

    def home_lane(self, f: Forward) -> int:
        """The lane ``f``'s copy is applied on (``channel_lane`` numbers a channel
        operation's)."""
        return self.channel_lane + f.partition if f.channel else f.partition

    def _dead_letter(
        self, out: Output, rec: InRecord, code: str, reason: str, received: datetime
    ) -> None:
        out.ledger.dead_letters.append(dead_letter_row(rec, code, reason, received))
        out.dlq.append(dlq_record(rec, code, reason))
        out.stats[f"dlq.{code}"] += 1

    def _alerts(self, out: Output, *, final: bool = False) -> None:
        """The intake's own alerter (files, rebuilds): this step's deaths and every run
        lane's report, then what the watermark decided (``final``: end of input)."""
        if self.alerter is None:
            return
        if self._alerter_undo is None:
            self._alerter_undo = self.alerter.to_bytes()
        self.alerter.observe(out.limit_deaths)
        for p in self.processors:
            self.alerter.report(p, self.lane_report(p, idle=not self.clock.is_behind(p)))
        rows = self.alerter.decide(final=final)
        out.ledger.alerts.extend(rows)
        out.alerts.extend(alert_record(r) for r in rows)


def store_isolating(
    intake: Intake,
    batches: Mapping[int, Sequence[InRecord]],
    now: float,
    store: Callable[[Output], None],
    parts: dict[int, Output] | None = None,
    *,
    forwarded: bool = False,
) -> Output:
    """Step every partition's records and store them in one go; isolate poison on refusal.

    ``store(out)`` writes ``out``'s rows and raises ``PermanentStoreError`` when they can
    never be stored (transient errors are the store's to retry). On refusal every step is
    undone and each partition's records are split in halves until the refused ones stand
    alone; those are dead-lettered ``unstorable`` and stored as such, the rest as usual.
    Returns the combined output of everything stored (its state writes included);
    ``parts``, when given, receives each partition's own share of it. ``forwarded``: the
    records are repartition-topic copies (``Intake.step``).
    """
    own: dict[int, Output] = {}
    for partition, records in batches.items():
        own[partition] = intake.step(partition, records, now, forwarded=forwarded)
    out = _combined(own.values())
    try:
        store(out)
    except PermanentStoreError as exc:
        for partition in reversed(list(batches)):
            intake.rollback(partition)
        log.warning("the ledger refused a batch (%s); isolating the records it refuses", exc)
        own = {
            p: _bisect(intake, p, records, now, store, forwarded) for p, records in batches.items()
        }
        out = _combined(own.values())
    else:
        for partition in batches:
            intake.commit(partition)
    if parts is not None:
        parts.update(own)
    return out


def _combined(outs: Iterable[Output]) -> Output:
    out = Output()
    for part in outs:
        out.extend(part)
    return out


def _bisect(
    intake: Intake,
    partition: int,
    records: Sequence[InRecord],
    now: float,
    store: Callable[[Output], None],
    forwarded: bool = False,
) -> Output:
    out = intake.step(partition, records, now, forwarded=forwarded)
    try:
        store(out)
    except PermanentStoreError as exc:
        intake.rollback(partition)
        if len(records) > 1:
            mid = len(records) // 2
            out = _bisect(intake, partition, records[:mid], now, store, forwarded)
            out.extend(_bisect(intake, partition, records[mid:], now, store, forwarded))
            return out
        rec = records[0]
        log.error(
            "the ledger refused %s:%d offset %d for good; dead-lettered as unstorable: %s",
            rec.source,
            partition,
            rec.offset,
            exc,
        )
        out = intake.unstorable(rec, f"the ledger refused this event: {exc}", now, partition)
        store(out)
        return out
    intake.commit(partition)
    return out
