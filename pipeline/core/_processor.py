"""The run-semantics processor of one source partition (or of a whole file).

``process(deliveries, now)`` adds each new event to its run, then settles every touched
run once: ``classify`` decides which of its events count, and the rows whose verdict or
owner changed since they were last written are written again with a higher version
(retracted where they no longer count). Staleness, grace and retention follow the shared
``EventClock`` (one pipeline-wide, skew-clamped watermark), so the ledger is a function of
the set of events delivered (schemas/CONTRACT.md rule 10); processing time (``now``)
only shortens the grace wait, and only when ``CoreConfig.processing_grace`` says so.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from prism.schemas import FastEvent, is_terminal_agent_event_type

from ._alerts import RULE_STALE, alert_record, stale_alert
from ._classify import DUPLICATE_SEQ, TENANT_MISMATCH, Classified, classify
from ._keyed import KeyedProcessor, _unpack
from ._rows import (
    OWNER_FIELDS,
    data_of,
    quarantine_record,
    quarantine_row,
    raw_row,
    turn_rows,
    usage_row,
)
from ._run import RunState, envelope_values, fact_of, from_us, id_hash, to_us
from ._timeline import RunView, run_row, view_of
from ._types import CoreConfig, Delivery, EventClock, LimitDeath, Output, OutRecord

__all__ = ["Processor"]

_US = 1_000_000
_DEATH = "limit_death"  # RunState.alerts key of the death last sent: tenant, axis, ts


def _live(terminal: bool, closed: bool, incomplete: bool) -> bool:
    """Whether a run is waiting to close or still open: the ticks read such runs."""
    return (terminal and not closed) or (not terminal and not incomplete)


def _classified(run: RunState) -> Classified:
    """``classify(run.facts)``, computed once per set of facts (a run is judged again at its
    close, shrink and stale mark, usually with the facts it was settled with)."""
    if run.classified is None or run.classified[0] != len(run.facts):
        run.classified = (len(run.facts), classify(run.facts))
    return run.classified[1]


class Processor(KeyedProcessor[RunState]):
    """Pure run semantics for one partition; state is a dict of ``RunState`` by run id."""

    ITEM_PREFIX = "r"
    META_PREFIX = "m"

    def __init__(
        self, config: CoreConfig | None = None, partition: int = -1, clock: EventClock | None = None
    ) -> None:
        super().__init__(config, partition, clock)
        self.runs: dict[str, RunState] = self.items
        self._pending_close: set[str] = set()  # terminal known, closed record not yet emitted
        self._open: set[str] = set()  # no terminal, not incomplete
        # Time queues, heaps: runs are not queued in time order (a run closed by the
        # processing-time grace closes at its terminal's time, which may be far ahead)
        self._retire: list[tuple[int, str]] = []  # (watermark when closed/incomplete, id)
        self._shrink: list[tuple[int, str]] = []  # (watermark to shrink at, run id)
        self._received: tuple[datetime | None, int] = (None, 0)  # (arrival time, its us)
        # closed runs at rest (``_rests``) whose shrink needs only their owner values: what
        # their last verdict said, so the shrink does not judge the decoded facts again;
        # and, when an owner is known, the state record their shrink writes, made while
        # they were decoded, so the shrink decodes nothing (``_maybe_shrink``). Packed, as
        # the run: held whole for the grace period at 10,000 events/s, these ~900-byte
        # records raised the worker's peak by ~100 MiB (bench/README.md)
        self._rest_meta: dict[str, tuple[dict[str, Any], bytes | None]] = {}

    @property
    def _grace_us(self) -> int:
        return int(self.config.grace_period_s * _US)

    def run_key(self, run_id: str) -> str:
        """State key of a run; it names the partition so a shared table can be split again."""
        return self.item_key(run_id)

    # -- KeyedProcessor hooks -------------------------------------------------------------
    def _copy(self, item: RunState) -> RunState:
        return item.copy()

    def _decode(self, raw: bytes) -> RunState:
        return RunState.from_bytes(raw)

    def _rests(self, item: RunState) -> bool:
        """A closed or incomplete run waits in its state record's bytes: no tick reads it,
        and an event, its shrink or its retirement decodes it (``_get``). Held whole for
        the grace period, closed runs' dicts were most of the worker's memory above the
        bare loop's at 10,000 events/s (bench/README.md); at rest they keep their bytes,
        packed (``_keyed._pack``)."""
        self._rest_meta.pop(item.run_id, None)  # of an earlier rest: its facts changed
        if _live(item.terminal is not None, item.closed, item.incomplete):
            return False
        judged = item.classified
        if (
            item.closed
            and item.tombstone is None
            and judged is not None
            and judged[0] == len(item.facts)
            and judged[1].missing_count == 0  # a close at the grace may leave a gap
        ):
            meta = judged[1].meta
            shrunk = None
            if item.terminal is not None and meta.get("tenant_id") is not None:
                # what its shrink will write, not packed: its tombstone's hashes do not
                # compress (LZ4 kept 93% of it, for a compression and a decompression).
                # Copied to its size: orjson's result keeps its buffer, 8 KiB for ~1 KiB
                shrunk = bytes(memoryview(item.shrunk(meta).to_bytes()))
            self._rest_meta[item.run_id] = (meta, shrunk)
        return True

    def _unindex(self, key: str) -> None:
        self._rest_meta.pop(key, None)  # a rollback or a drop: its verdict may be void
        self._pending_close.discard(key)
        self._open.discard(key)

    def _load_item(self, key: str, raw: bytes) -> None:
        """A run still open or waiting to close is decoded now (the next ticks read it); a
        closed or incomplete one stays in its stored bytes until an event or its shrink or
        retirement asks for it: most of a lane's runs, and nearly all of its restore time."""
        head = RunState.head(raw)
        if "f" in head or _live(head["t"] is not None, head["c"], head["inc"]):
            self._index(self._decode(raw))  # (a row of the format before: read whole)
            return
        self._cold[key] = raw
        self._index_parts(
            key, head["t"] is not None, head["c"], head["inc"], head["cw"], head["tb"] is not None,
            head["lu"],
        )  # fmt: skip

    def _index(self, run: RunState) -> None:
        self.runs[run.run_id] = run
        self._index_parts(
            run.run_id, run.terminal is not None, run.closed, run.incomplete, run.closed_wm_us,
            run.tombstone is not None, run.last_us,
        )  # fmt: skip

    def _index_parts(
        self,
        run_id: str,
        terminal: bool,
        closed: bool,
        incomplete: bool,
        closed_wm_us: int | None,
        tombstone: bool,
        last_us: int | None,
    ) -> None:
        self._pending_close.discard(run_id)
        self._open.discard(run_id)
        if terminal and not closed:
            self._pending_close.add(run_id)
        elif not terminal and not incomplete:
            self._open.add(run_id)
        if closed and closed_wm_us is not None:
            heapq.heappush(self._retire, (closed_wm_us, run_id))
            if not tombstone:
                heapq.heappush(self._shrink, (closed_wm_us + self._grace_us, run_id))
        elif incomplete and last_us is not None:
            heapq.heappush(self._retire, (last_us, run_id))

    # -- the batch ----------------------------------------------------------------------
    def process(self, deliveries: Iterable[Delivery], now: float) -> Output:
        out = Output()
        touched: dict[str, RunState] = {}
        for d in deliveries:
            self._add(d, now, out, touched)
        for run in touched.values():
            self._settle(run, now, out)
        self._tick(now, out, final=False)
        return self._finish(out)

    def finalize(self, now: float) -> Output:
        """End of input (file replay): close every run whose terminal arrived, apply staleness."""
        out = Output()
        self._tick(now, out, final=True)
        return self._finish(out)

    def tick(self, now: float) -> Output:
        """Let time pass without input (grace periods measured in processing time)."""
        out = Output()
        self._tick(now, out, final=False)
        return self._finish(out)

    def _add(self, d: Delivery, now: float, out: Output, touched: dict[str, RunState]) -> None:
        ev = d.event
        fast = type(ev) is FastEvent  # the fast parse path built ts, data and envelope
        run_id, event_id = ev.run_id, ev.event_id  # read once: ``ev`` is not a native class
        ts_us = ev.ts_us if fast else to_us(ev.ts)
        skewed = self.clock.observe(self.mark_key, ts_us, now)
        self._save(run_id)
        run = self._get(run_id)
        if run is None:
            run = RunState(run_id)
            self.runs[run_id] = run
            self._open.add(run_id)
            self._scan_due.append(run_id)
        if run.knows(event_id):
            out.stats["duplicate"] += 1
            return
        if d.received_at is not self._received[0]:  # one arrival time per batch
            self._received = (d.received_at, to_us(d.received_at))
        source = (d.source, d.partition, d.offset, self._received[1], d.traceparent)
        run.arrivals += 1
        if fast:
            data, envelope = ev.data, ev.envelope
        else:
            data, envelope = data_of(ev, self.config.redact_keys), envelope_values(ev)
        if run.facts:  # the envelope a run's facts share: one object, as a decoded run has
            last = run.facts[next(reversed(run.facts))]["e"]
            if last == envelope:
                envelope = last
        fact = fact_of(ev, data, envelope, ts_us, source, run.arrivals)
        if skewed:
            run.clock_skew = True
            fact["k"] = True  # stamped beyond the clock: never a limit death's time (rule 14)
        if run.tombstone is not None:
            self._after_close(run, event_id, fact, out)
            return
        run.facts[event_id] = fact
        touched[run_id] = run

    def _after_close(self, run: RunState, event_id: str, fact: dict[str, Any], out: Output) -> None:
        """A new event for a run whose facts are gone: every seq below its terminal arrived."""
        tb = run.tombstone
        assert tb is not None
        tb.ids.add(id_hash(event_id))
        tenant = fact["e"].get("tenant_id")
        if tenant is not None and tenant != tb.meta.get("tenant_id"):
            reason = TENANT_MISMATCH
        elif fact["s"] > tb.terminal_seq:
            terminal = is_terminal_agent_event_type(fact["t"])
            reason = "conflicting_terminal" if terminal else "post_terminal"
        else:
            reason = DUPLICATE_SEQ
        run.arrivals += 1
        out.ledger.quarantine.append(
            quarantine_row(
                run.run_id,
                event_id,
                fact,
                tb.meta,
                reason,
                version=self.row_version(run.version),
                retracted=False,
            )
        )
        out.quarantined.append(quarantine_record(run.run_id, event_id, fact, reason))
        out.stats[f"quarantine.{reason}"] += 1
        self._dirty.add(run.run_id)

    # -- settling a run -------------------------------------------------------------------
    def _settle(self, run: RunState, now: float, out: Output) -> None:
        """Classify the run's events and write what changed since it was last written."""
        cls = _classified(run)
        version = self.row_version(run.version)
        owner = {k: cls.meta.get(k) for k in OWNER_FIELDS}
        owner_sig = [owner[k] for k in OWNER_FIELDS]
        fresh = False
        applied = 0  # added to the stats once: a Counter's item is a generic call each
        for eid, fact in run.facts.items():
            reason = cls.reasons.get(eid, "")
            sig = [reason, eid in cls.superseded, owner_sig]
            old = run.emitted.get(eid)
            if old == sig:
                continue
            run.emitted[eid] = sig
            was = None if old is None else old[0]
            if reason:
                out.ledger.quarantine.append(
                    quarantine_row(
                        run.run_id, eid, fact, owner, reason, version=version, retracted=False
                    )
                )
                if was != reason:
                    out.quarantined.append(quarantine_record(run.run_id, eid, fact, reason))
                    out.stats[f"quarantine.{reason}"] += 1
                if was == "":  # it counted until now: its rows leave every view
                    self._event_rows(run, eid, fact, owner, False, version, True, out)
                    out.stats["retracted"] += 1
                elif was is None:
                    # quarantined the first time this state sees it: its rows are written
                    # retracted all the same, over any that a step never committed (an
                    # earlier owner's, or this process's before a crash) stored as counted
                    self._event_rows(run, eid, fact, owner, False, version, True, out)
            else:
                self._event_rows(run, eid, fact, owner, eid in cls.superseded, version, False, out)
                if was:  # it was quarantined until now
                    out.ledger.quarantine.append(
                        quarantine_row(
                            run.run_id, eid, fact, owner, was, version=version, retracted=True
                        )
                    )
                if old is None:
                    fresh = True
                    applied += 1
                    out.event_ts.append(fact["ts"] / _US)
        if applied:
            out.stats["applied"] += applied
        self._update_terminal(run, cls.terminal, now, fresh)
        view = view_of(run, cls)
        run.last_us = view.last_us
        out.ledger.turns.extend(turn_rows(run.run_id, run.facts, view, owner, run.turns, version))
        if run.terminal is not None and not run.closed and cls.missing_count == 0:
            self._close(run, view, out)
            return
        timeline = run.closed or run.incomplete
        out.ledger.runs.append(run_row(run, view, timeline=timeline, version=version))
        if run.closed:  # settled again after its close: its death may have changed
            self._death(run, view, out)
        if run.closed and cls.missing_count == 0:  # a gap filled after the close
            at = max(self.clock.watermark_us, run.closed_wm_us or 0)
            heapq.heappush(self._shrink, (at + self._grace_us, run.run_id))
        self._dirty.add(run.run_id)

    def _event_rows(
        self,
        run: RunState,
        eid: str,
        fact: dict[str, Any],
        owner: dict[str, Any],
        superseded: bool,
        version: int,
        retracted: bool,
        out: Output,
    ) -> None:
        out.ledger.events.append(raw_row(run.run_id, eid, fact, owner, version, retracted))
        if fact["t"] == "usage_recorded":
            out.ledger.usage.append(
                usage_row(
                    run.run_id,
                    eid,
                    fact,
                    owner,
                    superseded=superseded,
                    version=version,
                    retracted=retracted,
                )
            )

    def _update_terminal(
        self, run: RunState, terminal: tuple[int, str] | None, now: float, fresh: bool
    ) -> None:
        if terminal is None:
            run.terminal = None
            self._pending_close.discard(run.run_id)
            if run.incomplete and fresh:  # new events: no longer silent
                run.incomplete = False
                self._scan_due.append(run.run_id)  # judged again at this watermark
            if not run.incomplete:
                self._open.add(run.run_id)
            return
        seq, eid = terminal
        if run.terminal is None or run.terminal["id"] != eid:
            fact = run.facts[eid]
            run.terminal = {
                "seq": seq,
                "id": eid,
                "type": fact["t"],
                "ts": fact["ts"],
                "arrived": now,
            }
        run.incomplete = False
        self._open.discard(run.run_id)
        if not run.closed:
            self._pending_close.add(run.run_id)

    def _close(self, run: RunState, view: RunView, out: Output) -> None:
        self._save(run.run_id)
        run.closed = True
        run.closed_wm_us = self._closed_at(run, view)
        self._pending_close.discard(run.run_id)
        row = run_row(run, view, timeline=True, version=self.row_version(run.version))
        out.ledger.runs.append(row)
        out.closed.append(OutRecord(key=run.run_id.encode(), value=row.timeline.encode()))
        out.stats["closed"] += 1
        self._death(run, view, out)
        if run.alerts.get(RULE_STALE) == "firing":
            self._stale_alert(run, out, "resolved")
        heapq.heappush(self._retire, (run.closed_wm_us, run.run_id))
        heapq.heappush(self._shrink, (run.closed_wm_us + self._grace_us, run.run_id))
        self._dirty.add(run.run_id)

    def _closed_at(self, run: RunState, view: RunView) -> int:
        """The event time a run closes at: the watermark, but never before its terminal.

        The processing-time grace closes runs while the watermark may be held far back
        (at 0 by a lane that has records waiting and no mark yet); the close time decides
        when the run shrinks and when it is forgotten, which must not come a grace period
        or a retention after a time the pipeline never reached. A skewed terminal's time
        is no event time (rule 14): it stands for the clock plus the skew at its arrival,
        the furthest rule 14 lets an event reach. Not the watermark alone: that is
        wherever the other lanes happen to be when the terminal arrives (0 while one
        has no mark yet), so a run closed at 0 would be forgotten at the next tick and a
        later event of it would begin a new run, as it would not in another order.
        """
        term = view.terminal
        if term is None:
            at = 0
        elif term.get("k"):
            assert run.terminal is not None
            at = int(run.terminal["arrived"] * _US) + self.clock.max_skew_us
        else:
            at = term["ts"]
        return max(self.clock.watermark_us, at)

    def _death(self, run: RunState, view: RunView, out: Output) -> None:
        """Send the run's limit death when it differs from the one last sent (rule 16): a
        run closed by ``error`` with an accepted ``run_limit_exceeded`` dies at its
        terminal's time, on the axis of the highest-``seq`` such record, for its owner. A
        late lower-``seq`` terminal or a re-stated owner sends it again; a run that no
        longer is one sends its retraction."""
        term = view.terminal
        death, sig = None, ""
        if (
            view.limit is not None
            and term is not None
            and term["t"] == "error"
            and not term.get("k")  # a skewed terminal's time is no event time to count at
        ):
            tenant = view.cls.meta.get("tenant_id") or ""
            axis = str(view.limit.get("limit"))
            death = LimitDeath(tenant, axis, run.run_id, from_us(term["ts"]))
            sig = f"{tenant}\x1f{axis}\x1f{term['ts']}"
        sent = run.alerts.get(_DEATH, "")
        if sig == sent:
            return
        if death is not None:
            out.limit_deaths.append(death)
            run.alerts[_DEATH] = sig
        else:
            tenant, axis, ts = sent.split("\x1f")
            out.limit_deaths.append(LimitDeath(tenant, axis, run.run_id, from_us(int(ts)), True))
            del run.alerts[_DEATH]
        self._dirty.add(run.run_id)

    def pending_terminal_us(self) -> int | None:
        """The earliest terminal time of the runs waiting to close: their limit deaths are
        still to come, so the alerts' watermark may not pass it (rule 16)."""
        runs = self.runs
        return min((runs[r].terminal["ts"] for r in self._pending_close), default=None)  # type: ignore[index]

    # -- time: grace, staleness, retention -------------------------------------------------
    def _tick(self, now: float, out: Output, *, final: bool) -> None:
        cfg = self.config
        wm = self.clock.watermark_us
        grace_us = int(cfg.grace_period_s * _US)
        for run_id in sorted(self._pending_close):
            run = self.runs[run_id]
            term = run.terminal
            assert term is not None
            if (
                final
                or wm >= term["ts"] + grace_us
                or (cfg.processing_grace and now >= term["arrived"] + cfg.grace_period_s)
            ):
                self._close(run, view_of(run, _classified(run)), out)
        while self._shrink and self._shrink[0][0] <= wm:
            _, run_id = heapq.heappop(self._shrink)
            self._maybe_shrink(run_id)
        cutoff = wm - int(cfg.stale_after_s * _US)
        if final or wm - self._last_scan_us >= _US:
            self._last_scan_us = wm
            self._scan_due.clear()
            for run_id in sorted(r for r in self._open if (self.runs[r].last_us or 0) < cutoff):
                self._mark_incomplete(self.runs[run_id], out)
            expire = wm - int(cfg.tombstone_retention_s * _US)
            while self._retire and self._retire[0][0] < expire:
                _, run_id = heapq.heappop(self._retire)
                gone = self._get(run_id)
                if gone is not None and self._retired(gone, expire):
                    self._drop(run_id)
        elif self._scan_due:
            # runs that arrived since the last scan are judged at this watermark too,
            # though it has not moved: staleness must not depend on when a run arrived
            due, self._scan_due = sorted(set(self._scan_due)), []
            for run_id in due:
                fresh = self._get(run_id) if run_id in self._open else None
                if fresh is not None and (fresh.last_us or 0) < cutoff:
                    self._mark_incomplete(fresh, out)

    def _maybe_shrink(self, run_id: str) -> None:
        """A run closed for longer than the grace period, with no gap: keep a tombstone only.

        Until then its facts stay, so an event claiming one of its seqs within the grace
        period is judged on the whole set (rule 10); later, such an event is quarantined.
        A run no event has named a tenant for keeps its facts until its retention ends:
        the first event that names one, even past the terminal, makes that tenant the
        owner of all its rows (rule 11, ``classify``), which a tombstone cannot re-state.
        """
        verdict = self._rest_meta.pop(run_id, None)  # if it rested since
        if verdict is not None and verdict[1] is not None and run_id in self._cold:
            self._replace_resting(run_id, verdict[1], verdict)  # still as put to rest
            return
        rested = None if verdict is None else verdict[0]
        run = self._get(run_id)
        if run is None or not run.closed or run.tombstone is not None:
            return
        if rested is None or run.classified is not None:
            cls = _classified(run)
            if cls.missing_count:
                return  # gaps may still fill; a later close attempt queues it again
            meta = cls.meta
        else:
            meta = rested  # judged gap-free when it was put to rest, unchanged since
        if meta.get("tenant_id") is None:
            return  # an event may yet name the owner
        self._save(run_id)
        run.shrink(meta)
        self._dirty.add(run_id)

    def _reindex_resting(self, key: str, index: Any) -> None:
        """A rollback put a run back at rest, unshrunk: its verdicts and its shrink again."""
        self._rest_meta[key] = index
        head = RunState.head(_unpack(index[1]))  # the shrink changed nothing indexed here
        self._index_parts(
            key, head["t"] is not None, head["c"], head["inc"], head["cw"], False, head["lu"]
        )  # fmt: skip

    @staticmethod
    def _retired(run: RunState, expire_us: int) -> bool:
        """Closed (or incomplete and silent) for longer than the retention: forget the run."""
        if run.closed:
            return (run.closed_wm_us or 0) < expire_us
        return run.incomplete and (run.last_us or 0) < expire_us

    def _mark_incomplete(self, run: RunState, out: Output) -> None:
        self._save(run.run_id)
        self._open.discard(run.run_id)
        run.incomplete = True
        heapq.heappush(self._retire, (max(self.clock.watermark_us, run.last_us or 0), run.run_id))
        view = view_of(run, _classified(run))
        out.ledger.runs.append(
            run_row(run, view, timeline=True, version=self.row_version(run.version))
        )
        out.stats["incomplete"] += 1
        if run.alerts.get(RULE_STALE) != "firing":
            self._stale_alert(run, out, "firing")
        self._dirty.add(run.run_id)

    def _stale_alert(self, run: RunState, out: Output, state: str) -> None:
        """Raise (or resolve) the alert of a run without a terminal past the stale threshold.

        It fires at the event time the run went stale (its last event plus the threshold),
        not at the watermark the scan saw: that depends on where batches cut (rule 10). It
        resolves at its terminal's time (rule 16).
        """
        tenant = None
        if run.facts:
            tenant = _classified(run).meta.get("tenant_id")
        last_us = run.last_us or 0
        at_us = self.clock.watermark_us
        if state == "firing":
            at_us = min(at_us, last_us + int(self.config.stale_after_s * _US))
        elif run.terminal is not None:  # resolved at the terminal's time (rule 16)
            at_us = run.terminal["ts"]
        row = stale_alert(
            run.run_id,
            tenant,
            last_us,
            at_us,
            self.config.stale_after_s,
            state,
        )
        run.alerts[RULE_STALE] = state
        out.ledger.alerts.append(row)
        out.alerts.append(alert_record(row))
