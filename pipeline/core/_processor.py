"""The run-semantics processor of one source partition (or of a whole file).

``process(deliveries, now)`` applies CONTRACT.md's rules to a batch of parsed events and
returns an ``Output``: ledger rows, quarantine / runs-closed / alert records, limit deaths
for the exhaustion alerter and the state writes the shell must persist. Event time (the
partition's watermark) drives staleness, grace and retention, so a replay gives the same
answer as the live stream; processing time (``now``) only shortens the grace wait.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

import orjson

from prism.schemas import (
    QuarantineRow,
    event_to_wire,
    is_terminal_agent_event_type,
)

from ._alerts import alert_record, stale_alert
from ._cache import CacheMinutes
from ._rows import data_of, raw_row, usage_rows
from ._run import RunState, from_us, to_us
from ._timeline import run_row, turn_rows, view_of
from ._types import CoreConfig, Delivery, LimitDeath, Output, OutRecord

__all__ = ["Processor"]

_RUN_PREFIX = "r\x1f"
_META_PREFIX = "m\x1f"
_TurnKey = tuple[str, int, int]


class Processor:
    """Pure run semantics for one partition; state is a dict of ``RunState`` by run id."""

    def __init__(self, config: CoreConfig | None = None, partition: int = -1) -> None:
        self.config = config or CoreConfig()
        self.partition = partition
        self.runs: dict[str, RunState] = {}
        self.watermark_us = 0
        self.next_offset: int | None = None  # next source offset to process (set by the shell)
        self.cache = CacheMinutes(partition)
        self._pending_close: set[str] = set()  # terminal seen, closed record not yet emitted
        self._open: set[str] = set()  # no terminal, not incomplete
        self._retire: deque[tuple[int, str]] = deque()  # (watermark when closed/incomplete, run id)
        self._last_scan_us = 0
        self._dirty: set[str] = set()
        self._dropped: set[str] = set()

    # -- state --------------------------------------------------------------------------
    @property
    def meta_key(self) -> str:
        return f"{_META_PREFIX}{self.partition}"

    def run_key(self, run_id: str) -> str:
        """State key of a run; it names the partition so a shared table can be split again."""
        return f"{_RUN_PREFIX}{self.partition}\x1f{run_id}"

    def owns_key(self, key: str) -> bool:
        """Whether a state key belongs to this partition's processor."""
        kind, _, rest = key.partition("\x1f")
        return rest.split("\x1f", 1)[0] == str(self.partition) and kind in ("r", "m", "c")

    def load(self, items: Iterable[tuple[str, bytes]]) -> None:
        """Restore state written earlier by ``Output.state_writes`` (e.g. from a changelog)."""
        for key, value in items:
            if key.startswith(_RUN_PREFIX):
                self._index(RunState.from_bytes(value))
            elif key == self.meta_key:
                meta = orjson.loads(value)
                self.watermark_us = meta["wm"]
                self.next_offset = meta.get("no")
            elif key.startswith("c\x1f"):
                self.cache.load(key, value)
        self._retire = deque(sorted(self._retire))

    def _index(self, run: RunState) -> None:
        self.runs[run.run_id] = run
        self._pending_close.discard(run.run_id)
        self._open.discard(run.run_id)
        if run.terminal is not None and not run.closed:
            self._pending_close.add(run.run_id)
        elif run.terminal is None and not run.incomplete:
            self._open.add(run.run_id)
        if run.closed and run.closed_wm_us is not None:
            self._retire.append((run.closed_wm_us, run.run_id))
        elif run.incomplete and run.last_us is not None:
            self._retire.append((run.last_us, run.run_id))

    # -- the batch ----------------------------------------------------------------------
    def process(self, deliveries: Iterable[Delivery], now: float) -> Output:
        out = Output()
        touched: dict[str, set[_TurnKey]] = {}
        for d in deliveries:
            self._apply_one(d, now, out, touched)
        for run_id, keys in touched.items():
            self._emit_run(self.runs[run_id], keys, now, out)
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

    def _apply_one(
        self, d: Delivery, now: float, out: Output, touched: dict[str, set[_TurnKey]]
    ) -> None:
        ev = d.event
        ts_us = to_us(ev.ts)
        if ts_us > self.watermark_us:
            self.watermark_us = ts_us
        run = self.runs.get(ev.run_id)
        if run is None:
            run = RunState(ev.run_id)
            self.runs[ev.run_id] = run
            self._open.add(ev.run_id)
        if run.is_duplicate(ev.event_id, ev.seq):
            out.stats["duplicate"] += 1
            return
        run.mark_seen(ev.event_id, ev.seq)
        is_terminal = is_terminal_agent_event_type(ev.type)
        term = run.terminal
        if term is not None and ev.seq > term["seq"]:
            self._quarantine(out, d, "conflicting_terminal" if is_terminal else "post_terminal")
            return
        data = data_of(ev)
        if is_terminal:
            if (
                term is not None
            ):  # a lower-seq terminal wins; what lay above it is now post-terminal
                self._retro_quarantine(run, ev.seq, d, out)
            run.terminal = {
                "seq": ev.seq,
                "type": ev.type,
                "id": ev.event_id,
                "ts": ts_us,
                "arrived": now,
            }
            run.closed = False
            self._open.discard(run.run_id)
            self._pending_close.add(run.run_id)
            if run.incomplete:
                run.incomplete = False
        elif run.incomplete:
            run.incomplete = False
            self._open.add(run.run_id)
        run.apply(ev, data, ts_us)
        out.stats["applied"] += 1
        out.ledger.events.append(raw_row(d, ev, data))
        keys = touched.setdefault(run.run_id, set())
        if ev.type == "provider_turn_finished":
            keys.add(("model", data["turn"], data["attempt"]))
            m = run.meta_value
            self.cache.add_turn(
                ts_us, m("tenant_id") or "", m("provider") or "", m("model") or "", data
            )
        elif ev.type == "deterministic_turn_finished":
            keys.add(("deterministic", data["turn"], 0))
        elif ev.type == "usage_recorded":
            out.ledger.usage.extend(usage_rows(run, ev.seq))
            if data["scope"] == "provider_turn":
                keys.add(("model", data["turn"], data["attempt"]))

    def _quarantine(self, out: Output, d: Delivery, reason: str) -> None:
        ev = d.event
        wire = orjson.dumps(event_to_wire(ev))
        out.stats[f"quarantine.{reason}"] += 1
        out.ledger.quarantine.append(
            QuarantineRow(
                event_id=ev.event_id,
                run_id=ev.run_id,
                seq=ev.seq,
                type=ev.type,
                ts=ev.ts,
                tenant_id=ev.tenant_id,
                reason=reason,
                payload=wire.decode(),
                source=d.source,
                partition=d.partition,
                offset=d.offset,
                received_at=d.received_at,
            )
        )
        out.quarantined.append(
            OutRecord(
                key=ev.run_id.encode(),
                value=wire,
                headers=(
                    ("reason", reason.encode()),
                    ("source-topic", d.source.encode()),
                    ("source-partition", str(d.partition).encode()),
                    ("source-offset", str(d.offset).encode()),
                ),
            )
        )

    def _retro_quarantine(self, run: RunState, new_term_seq: int, d: Delivery, out: Output) -> None:
        """Facts above a newly arrived lower terminal leave the run (their raw rows stay logged)."""
        for seq in [s for s in run.facts if s > new_term_seq]:
            fact = run.facts.pop(seq)
            reason = (
                "conflicting_terminal"
                if is_terminal_agent_event_type(fact["t"])
                else "post_terminal"
            )
            out.stats[f"quarantine.{reason}"] += 1
            out.ledger.quarantine.append(
                QuarantineRow(
                    event_id=fact["id"],
                    run_id=run.run_id,
                    seq=seq,
                    type=fact["t"],
                    ts=from_us(fact["ts"]),
                    tenant_id=run.meta_value("tenant_id"),
                    reason=reason,
                    payload=orjson.dumps(
                        {"type": fact["t"], "seq": seq, "data": fact["d"]}
                    ).decode(),
                    source=d.source,
                    partition=d.partition,
                    offset=-1,
                    received_at=d.received_at,
                )
            )
        run.revision += 1

    # -- closing, staleness, retention --------------------------------------------------
    def _emit_run(self, run: RunState, keys: set[_TurnKey], now: float, out: Output) -> None:
        view = view_of(run)
        if run.terminal is not None and not run.closed and not run.missing_seqs():
            self._close(run, view, out)
            return
        out.ledger.runs.append(run_row(run, view, timeline=run.closed or run.incomplete))
        out.ledger.turns.extend(turn_rows(run, view, keys))
        if run.closed and not run.missing_seqs():
            self._shrink(run)
        self._dirty.add(run.run_id)

    def _close(self, run: RunState, view: Any, out: Output) -> None:
        run.closed = True
        run.closed_wm_us = self.watermark_us
        run.revision += 1
        self._pending_close.discard(run.run_id)
        row = run_row(run, view, timeline=True)
        out.ledger.runs.append(row)
        out.ledger.turns.extend(turn_rows(run, view, None))
        out.closed.append(OutRecord(key=run.run_id.encode(), value=row.timeline.encode()))
        out.stats["closed"] += 1
        if view.limit is not None and view.terminal is not None and view.terminal["t"] == "error":
            out.limit_deaths.append(
                LimitDeath(
                    tenant_id=run.meta_value("tenant_id") or "",
                    axis=str(view.limit.get("limit")),
                    run_id=run.run_id,
                    ts=from_us(view.terminal["ts"]),
                )
            )
        if run.alerts.get("stale_run") == "firing":
            self._stale_alert(run, out, "resolved")
        self._retire.append((self.watermark_us, run.run_id))
        if not row.missing_seqs:
            self._shrink(run)
        self._dirty.add(run.run_id)

    def _shrink(self, run: RunState) -> None:
        if not run.tombstone:
            run.shrink()

    def _tick(self, now: float, out: Output, *, final: bool) -> None:
        cfg = self.config
        grace_us = int(cfg.grace_period_s * 1_000_000)
        for run_id in list(self._pending_close):
            run = self.runs[run_id]
            term = run.terminal
            assert term is not None
            if (
                final
                or self.watermark_us >= term["ts"] + grace_us
                or now >= term["arrived"] + cfg.grace_period_s
            ):
                self._close(run, view_of(run), out)
        if final or self.watermark_us - self._last_scan_us >= 1_000_000:
            self._last_scan_us = self.watermark_us
            cutoff = self.watermark_us - int(cfg.stale_after_s * 1_000_000)
            for run_id in [r for r in self._open if (self.runs[r].last_us or 0) < cutoff]:
                self._mark_incomplete(self.runs[run_id], out)
            expire = self.watermark_us - int(cfg.tombstone_retention_s * 1_000_000)
            while self._retire and self._retire[0][0] < expire:
                _, run_id = self._retire.popleft()
                gone = self.runs.get(run_id)
                if gone is not None and self._retired(gone, expire):
                    del self.runs[run_id]
                    self._open.discard(run_id)
                    self._dirty.discard(run_id)
                    self._dropped.add(run_id)
            out.state_writes.update(self.cache.expire(expire))

    @staticmethod
    def _retired(run: RunState, expire_us: int) -> bool:
        """Closed (or incomplete and silent) for longer than the retention: forget the run."""
        if run.closed:
            return (run.closed_wm_us or 0) < expire_us
        return run.incomplete and (run.last_us or 0) < expire_us

    def _mark_incomplete(self, run: RunState, out: Output) -> None:
        self._open.discard(run.run_id)
        run.incomplete = True
        run.revision += 1
        self._retire.append((self.watermark_us, run.run_id))
        view = view_of(run)
        out.ledger.runs.append(run_row(run, view, timeline=True))
        out.stats["incomplete"] += 1
        if run.alerts.get("stale_run") != "firing":
            self._stale_alert(run, out, "firing")
        self._dirty.add(run.run_id)

    def _stale_alert(self, run: RunState, out: Output, state: str) -> None:
        """Raise (or resolve) the alert of a run without a terminal past the stale threshold."""
        row = stale_alert(
            run.run_id,
            run.meta_value("tenant_id"),
            run.last_us or 0,
            self.watermark_us,
            self.config.stale_after_s,
            state,
        )
        run.alerts["stale_run"] = state
        self._alert(out, row)

    def _alert(self, out: Output, row: Any) -> None:
        out.ledger.alerts.append(row)
        out.alerts.append(alert_record(row))

    def _finish(self, out: Output) -> Output:
        out.ledger.cache_minutes.extend(self.cache.take_rows())
        writes = out.state_writes
        writes.update(self.cache.take_state_writes())
        for run_id in self._dirty:
            writes[self.run_key(run_id)] = self.runs[run_id].to_bytes()
        for run_id in self._dropped:
            writes[self.run_key(run_id)] = None
        writes[self.meta_key] = orjson.dumps({"wm": self.watermark_us, "no": self.next_offset})
        self._dirty.clear()
        self._dropped.clear()
        return out
