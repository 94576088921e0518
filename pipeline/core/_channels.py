"""The channel-operation semantics of one source partition (schemas/CONTRACT.md, "Channel
operations"): pure, synchronous, beside the run semantics and sharing their machinery.

``process(deliveries, now)`` adds each new record to its operation (an ``eventId`` seen
again changes nothing), then settles every touched operation once: ``judge`` decides which
records count (one per ``seq``, legal transitions only, applied in ``seq`` order), and the
rows whose verdict changed are written again with the operation's higher version:

- ``channel_operations``: the operation's latest state (one row per operation);
- ``channel_denials``: each accepted ``denied`` admission (per-minute counts are a view);
- ``channel_quarantine``: ``illegal_transition`` / ``duplicate_seq`` records (retracted if a
  lower ``seq`` arrives that makes them legal);
- ``channel_watermarks``: the shared event-time watermark, whenever it moved, so the
  ledger measures open items' ages in event time as the core does.

Time follows the pipeline-wide ``EventClock`` shared with the run semantics: an operation
``executing`` since before the watermark minus ``CoreConfig.channel_stuck_s`` is flagged
``stuck``; finished operations are forgotten after ``tombstone_retention_s``.
Transactions, state keys and state writes are ``KeyedProcessor``'s.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from prism.schemas import CHANNEL_FINAL_STATES, ChannelOperation, ChannelWatermarkRow

from ._channel_state import (
    DENIAL_PREFIX,
    ILLEGAL_TRANSITION,
    OperationState,
    denial_row,
    fact_of,
    judge,
    operation_row,
    quarantine_record,
    quarantine_row,
)
from ._keyed import KeyedProcessor
from ._run import from_us, to_us
from ._types import CoreConfig, Delivery, EventClock, Output

__all__ = ["WATERMARK_KEY", "ChannelProcessor"]

WATERMARK_KEY = "pipeline"
_US = 1_000_000


class ChannelProcessor(KeyedProcessor[OperationState]):
    """Pure channel-operation semantics for one partition; state by operation id."""

    ITEM_PREFIX = "c"
    META_PREFIX = "cm"

    def __init__(
        self, config: CoreConfig | None = None, partition: int = -1, clock: EventClock | None = None
    ) -> None:
        super().__init__(config, partition, clock)
        self.operations: dict[str, OperationState] = self.items
        self._executing: dict[str, int] = {}  # not yet stuck: operation -> entered (us)
        self._retire: list[tuple[int, str]] = []  # heap: (last record us, finished operation)
        self._wm_written = 0
        self._wm_saved: list[int] = []

    # -- KeyedProcessor hooks -------------------------------------------------------------
    def _copy(self, item: OperationState) -> OperationState:
        return item.copy()

    def _decode(self, raw: bytes) -> OperationState:
        return OperationState.from_bytes(raw)

    def _unindex(self, key: str) -> None:
        self._executing.pop(key, None)

    def _index(self, op: OperationState) -> None:
        self.operations[op.key] = op
        self._executing.pop(op.key, None)
        verdict = judge(op.facts)
        if verdict.state == "executing" and not op.stuck:
            self._executing[op.key] = op.facts[verdict.accepted[-1]]["ts"]
        elif verdict.state in CHANNEL_FINAL_STATES:
            heapq.heappush(self._retire, (op.last_us, op.key))

    def _meta(self) -> dict[str, object]:
        return {"ww": self._wm_written}

    def _load_meta(self, meta: dict[str, object]) -> None:
        written = meta.get("ww")
        self._wm_written = max(self._wm_written, written if isinstance(written, int) else 0)

    def begin(self) -> None:
        super().begin()
        self._wm_saved.append(self._wm_written)

    def commit(self) -> None:
        super().commit()
        self._wm_saved.pop()

    def rollback(self) -> None:
        super().rollback()
        self._wm_written = self._wm_saved.pop()

    # -- the batch ----------------------------------------------------------------------
    def process(self, deliveries: Iterable[Delivery[ChannelOperation]], now: float) -> Output:
        out = Output()
        touched: dict[str, OperationState] = {}
        for d in deliveries:
            self._add(d, now, out, touched)
        for op in touched.values():
            self._settle(op, out)
        self._tick(out, final=False)
        return self._finish(out)

    def tick(self, now: float) -> Output:
        """Let time pass without input: stuck operations, retention, the watermark row."""
        out = Output()
        self._tick(out, final=False)
        return self._finish(out)

    def finalize(self, now: float) -> Output:
        """End of input (file replay): flag what is stuck at the final watermark."""
        out = Output()
        self._tick(out, final=True)
        return self._finish(out)

    def _add(
        self,
        d: Delivery[ChannelOperation],
        now: float,
        out: Output,
        touched: dict[str, OperationState],
    ) -> None:
        rec = d.event
        ts_us = to_us(rec.ts)
        self.clock.observe(self.mark_key, ts_us, now)  # a skewed record moves no mark
        key = rec.operation_id if rec.operation_id is not None else DENIAL_PREFIX + rec.event_id
        self._save(key)
        op = self.operations.get(key)
        if op is None:
            op = self.operations[key] = OperationState(key)
        if op.knows(rec.event_id):
            out.stats["duplicate"] += 1
            return
        op.arrivals += 1
        op.last_us = max(op.last_us, ts_us)
        source = (d.source, d.partition, d.offset, to_us(d.received_at))
        op.facts[rec.event_id] = fact_of(rec, ts_us, source)
        touched[key] = op

    def _settle(self, op: OperationState, out: Output) -> None:
        """Judge the operation's records and write what changed since it was last written."""
        verdict = judge(op.facts)
        version = self.row_version(op.version)
        for eid, fact in op.facts.items():
            reason = verdict.reasons.get(eid, "")
            was = op.emitted.get(eid)
            if was == reason:
                continue
            op.emitted[eid] = reason
            denied = fact["w"]["state"] == "denied"
            if reason:
                out.ledger.channel_quarantine.append(
                    quarantine_row(eid, fact, reason, version, retracted=False)
                )
                out.quarantined.append(quarantine_record(fact, reason))
                out.stats[f"quarantine.{reason}"] += 1
                if (was == "" or was is None) and denied:  # it counted until now, or a
                    # step never committed may have stored it as counted (worker/_slotstate)
                    out.ledger.channel_denials.append(denial_row(eid, fact, version, True))
            else:
                if was or (was is None and not op.standalone):  # quarantined until now, or
                    # maybe by a step never committed (a first sight: written retracted all
                    # the same, over a row an earlier owner stored and never committed; a
                    # denial without an operation is never quarantined)
                    out.ledger.channel_quarantine.append(
                        quarantine_row(
                            eid, fact, was or ILLEGAL_TRANSITION, version, retracted=True
                        )
                    )
                if denied:
                    out.ledger.channel_denials.append(denial_row(eid, fact, version, False))
                    out.stats["channel.denied"] += 1
            if was is None:
                out.stats["channel.records"] += 1
                out.event_ts.append(fact["ts"] / _US)
        self._executing.pop(op.key, None)
        if verdict.state == "executing":
            entered = op.facts[verdict.accepted[-1]]["ts"]
            op.stuck = entered < self._stuck_before()
            if not op.stuck:
                self._executing[op.key] = entered
        else:
            op.stuck = False
        if verdict.state in CHANNEL_FINAL_STATES:
            heapq.heappush(self._retire, (op.last_us, op.key))
        if not op.standalone:
            out.ledger.channel_operations.append(
                operation_row(op, verdict, self.row_version(op.version))
            )
        self._dirty.add(op.key)

    # -- time: stuck operations, retention, the watermark row --------------------------
    def _stuck_before(self) -> int:
        return self.clock.watermark_us - int(self.config.channel_stuck_s * _US)

    def _tick(self, out: Output, *, final: bool) -> None:
        wm = self.clock.watermark_us
        if final or wm - self._last_scan_us >= _US:
            self._last_scan_us = wm
            cutoff = self._stuck_before()
            for key in sorted(k for k, entered in self._executing.items() if entered < cutoff):
                self._save(key)
                del self._executing[key]
                op = self.operations[key]
                op.stuck = True
                out.ledger.channel_operations.append(
                    operation_row(op, judge(op.facts), self.row_version(op.version))
                )
                out.stats["channel.stuck"] += 1
                self._dirty.add(key)
            expire = wm - int(self.config.tombstone_retention_s * _US)
            while self._retire and self._retire[0][0] < expire:
                _, key = heapq.heappop(self._retire)
                gone = self.operations.get(key)
                finished = gone is not None and judge(gone.facts).state in CHANNEL_FINAL_STATES
                if finished and gone is not None and gone.last_us < expire:
                    self._drop(key)
        if wm > self._wm_written:
            self._wm_written = wm
            out.ledger.channel_watermarks.append(
                ChannelWatermarkRow(key=WATERMARK_KEY, watermark=from_us(wm), version=wm)
            )
