"""Run-limit exhaustion alerts, a function of the set of deaths (schemas/CONTRACT.md rule 16).

A limit death's time is its terminal's ``ts``. For each (tenant, axis) the alert fires at
every death that lifts the count of deaths in ``(t - window, t]`` to the threshold while
none is firing, and resolves at the time the count drops below it (a death leaves the
window ``window`` after it happened): the sweep the simulator's manifest makes over the
whole set.

The alerter decides those times only once the pipeline-wide watermark has passed them by
the allowed lateness, never at arrival, so its rows depend neither on the order deaths
arrive in nor on how they were split into batches, partitions or processes. The watermark
is the minimum over the input lanes that are not idle of their event-time marks, held
back by every lane's earliest terminal still waiting to close (a death still to come);
it never moves backwards. One instance sees every death and every lane's report (the
worker routes both through a single-partition topic); until each expected lane has
reported, nothing is decided. A death arriving for a time already decided is counted
``late``: it still counts for the times after, and decided alerts are not re-opened; one
more than a window older than the decided time changes no count still to decide and is
dropped uncounted (it cannot be told apart from a re-delivery of a death long forgotten).
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import orjson

from prism.schemas import AlertRow

from ._run import from_us, to_us
from ._types import LaneReport, LimitDeath, OutRecord

__all__ = [
    "RULE_EXHAUSTION",
    "RULE_STALE",
    "ExhaustionAlerter",
    "alert_record",
    "death_record",
    "decision_time",
    "decode_alerter_input",
    "lane_record",
    "reports_watermark",
    "stale_alert",
]

RULE_EXHAUSTION = "run_limit_exhaustion"
RULE_STALE = "stale_run"
STATE_FORMAT = 2  # the version of ``ExhaustionAlerter.to_bytes``
_NEVER = -(1 << 62)  # "nothing decided yet", below any event time


@dataclass(slots=True)
class _Key:
    deaths: list[tuple[int, str]] = field(default_factory=list)  # sorted (ts us, run id)
    firing: tuple[str, int] | None = None  # (alert id, firing time us)


class ExhaustionAlerter:
    """The exhaustion alert of rule 16 over limit deaths and lane reports.

    ``observe`` and ``report`` only record; ``decide`` emits the rows whose times the
    watermark (less the allowed lateness) has passed since the last call. ``lanes``: the
    input lanes whose reports the watermark waits for (None: those that reported).

    Example::

        a = ExhaustionAlerter(window_s=300, threshold=5, lateness_s=30, lanes=[0, 1])
        a.observe(deaths)
        a.report(0, LaneReport(mark_us=...)); a.report(1, LaneReport(mark_us=...))
        rows = a.decide()            # what the watermark has settled
        rows += a.decide(final=True)  # end of input: everything up to the watermark
    """

    def __init__(
        self,
        window_s: float,
        threshold: int,
        lateness_s: float = 0.0,
        lanes: Iterable[int] | None = None,
    ) -> None:
        self.window_us = int(window_s * 1_000_000)
        self.threshold = threshold
        self.lateness_us = int(lateness_s * 1_000_000)
        self.expected: frozenset[int] | None = None if lanes is None else frozenset(lanes)
        self.keys: dict[tuple[str, str], _Key] = {}
        self.runs: dict[str, tuple[str, str, int]] = {}  # run id -> (tenant, axis, ts us)
        self.lanes: dict[int, LaneReport] = {}
        self.watermark_us = 0  # the pipeline-wide watermark; never moves backwards
        self.decided_us = _NEVER  # every time at or before this is decided
        self.late = 0  # deaths (or changes of one) that arrived for a decided time

    def expect(self, lanes: Collection[int]) -> None:
        """The lanes the watermark waits for (the input's partitions)."""
        self.expected = frozenset(lanes)

    # -- input ----------------------------------------------------------------------------
    def observe(self, deaths: Iterable[LimitDeath]) -> None:
        """Record deaths; a run's later record replaces its earlier one (or retracts it)."""
        for d in deaths:
            ts = to_us(d.ts)
            old = self.runs.pop(d.run_id, None)
            if old is not None:
                k = self.keys.get((old[0], old[1]))
                if k is not None:
                    i = bisect.bisect_left(k.deaths, (old[2], d.run_id))
                    if i < len(k.deaths) and k.deaths[i] == (old[2], d.run_id):
                        del k.deaths[i]
            if ts + self.window_us <= self.decided_us:
                continue  # it can change no count still to decide (nor is it told apart
                # from a re-delivery of a death already forgotten): neither counted nor late
            same = old == (d.tenant_id, d.axis, ts) and not d.retract
            if not same and min(ts, old[2] if old else ts) <= self.decided_us:
                self.late += 1  # a decided time would have counted it otherwise
            if d.retract:
                continue
            self.runs[d.run_id] = (d.tenant_id, d.axis, ts)
            key = (d.tenant_id, d.axis)
            bisect.insort(self.keys.setdefault(key, _Key()).deaths, (ts, d.run_id))

    def report(self, lane: int, report: LaneReport) -> None:
        """Record a lane's latest report (it replaces the lane's last one)."""
        self.lanes[lane] = report

    # -- deciding -------------------------------------------------------------------------
    def watermark(self) -> int | None:
        """The pipeline-wide watermark the lanes' reports give (None: not all reported)."""
        return reports_watermark(self.lanes, self.expected)

    def decide(self, *, final: bool = False) -> list[AlertRow]:
        """The rows of every firing and resolving at times the watermark, less the allowed
        lateness, passed since the last call. ``final`` (end of input) and a stream whose
        every lane is quiet with no run waiting to close decide up to the watermark itself."""
        self.watermark_us, until = decision_time(
            self.lanes, self.expected, self.watermark_us, self.lateness_us, final=final
        )
        if until is None or until <= self.decided_us:
            return []
        rows: list[AlertRow] = []
        for key in sorted(self.keys):
            rows += self._sweep(key, self.keys[key], self.decided_us, until)
        self.decided_us = until
        self._prune()
        rows.sort(key=lambda r: (r.ts, r.tenant_id or "", r.key or ""))
        return rows

    def _sweep(self, key: tuple[str, str], k: _Key, after: int, until: int) -> list[AlertRow]:
        times = {ts for ts, _ in k.deaths} | {ts + self.window_us for ts, _ in k.deaths}
        rows = []
        for at in sorted(t for t in times if after < t <= until):
            count = self._count(k, at)
            if k.firing is None and count >= self.threshold:
                alert_id = f"{RULE_EXHAUSTION}:{key[0]}:{key[1]}:{from_us(at).isoformat()}"
                k.firing = (alert_id, at)
                rows.append(self._row(key, alert_id, "firing", at, count, 1))
            elif k.firing is not None and count < self.threshold:
                rows.append(self._row(key, k.firing[0], "resolved", at, count, 2))
                k.firing = None
        return rows

    def _count(self, k: _Key, at_us: int) -> int:
        lo = bisect.bisect_right(k.deaths, (at_us - self.window_us, "\uffff"))
        hi = bisect.bisect_right(k.deaths, (at_us, "\uffff"))
        return hi - lo

    def _prune(self) -> None:
        """Forget deaths that left the window before the decided time: no count still to
        decide includes them."""
        horizon = self.decided_us - self.window_us
        for key in list(self.keys):
            k = self.keys[key]
            cut = bisect.bisect_right(k.deaths, (horizon, "\uffff"))
            for _, run_id in k.deaths[:cut]:
                self.runs.pop(run_id, None)
            del k.deaths[:cut]
            if not k.deaths and k.firing is None:
                del self.keys[key]

    # -- state ----------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        return orjson.dumps(
            {
                "v": STATE_FORMAT,
                "w": self.window_us,
                "t": self.threshold,
                "l": self.lateness_us,
                "x": None if self.expected is None else sorted(self.expected),
                "wm": self.watermark_us,
                "d": self.decided_us,
                "late": self.late,
                "k": [[list(key), k.deaths, k.firing] for key, k in self.keys.items()],
                "lanes": [
                    [lane, r.mark_us, r.pending_us, r.idle, r.quiet, r.hold_us]
                    for lane, r in self.lanes.items()
                ],
            }
        )

    @classmethod
    def from_bytes(cls, raw: bytes) -> ExhaustionAlerter:
        """The alerter ``to_bytes`` wrote; a state of another format version is refused."""
        d = orjson.loads(raw)
        if not isinstance(d, dict) or d.get("v") != STATE_FORMAT:
            version = d.get("v") if isinstance(d, dict) else None
            raise ValueError(
                f"alerter state of format {version!r} cannot be read (this version reads "
                f"{STATE_FORMAT}); reset the alert-state table to start over"
            )
        alerter = cls(d["w"] / 1_000_000, d["t"], d["l"] / 1_000_000, d["x"])
        alerter.watermark_us = d["wm"]
        alerter.decided_us = d["d"]
        alerter.late = d["late"]
        for key, deaths, firing in d["k"]:
            k = _Key([(ts, run) for ts, run in deaths], None if firing is None else tuple(firing))
            alerter.keys[(key[0], key[1])] = k
            for ts, run in k.deaths:
                alerter.runs[run] = (key[0], key[1], ts)
        for lane, mark, pending, idle, quiet, *hold in d["lanes"]:  # no hold: written before
            alerter.lanes[lane] = LaneReport(mark, pending, idle, quiet, hold[0] if hold else None)
        return alerter

    def _row(
        self, key: tuple[str, str], alert_id: str, state: str, at_us: int, count: int, version: int
    ) -> AlertRow:
        tenant, axis = key
        window_end = from_us(at_us)
        return AlertRow(
            alert_id=alert_id,
            rule=RULE_EXHAUSTION,
            state=state,
            tenant_id=tenant,
            key=axis,
            value=float(count),
            threshold=float(self.threshold),
            window_start=window_end - timedelta(microseconds=self.window_us),
            window_end=window_end,
            ts=window_end,
            message=(
                f"{count} runs of tenant {tenant!r} died on limit {axis!r} within "
                f"{self.window_us / 1e6:.0f}s (threshold {self.threshold})"
                if state == "firing"
                else f"limit deaths on {axis!r} for tenant {tenant!r} back below {self.threshold}"
            ),
            version=version,
        )


def stale_alert(
    run_id: str, tenant: str | None, last_us: int, wm_us: int, stale_after_s: float, state: str
) -> AlertRow:
    """The alert of a run with no terminal for longer than the stale threshold, as of event
    time ``wm_us`` (firing: when it went stale; resolved: when its terminal closed it)."""
    return AlertRow(
        alert_id=f"{RULE_STALE}:{run_id}",
        rule=RULE_STALE,
        state=state,
        tenant_id=tenant,
        key=run_id,
        value=(wm_us - last_us) / 1e6,
        threshold=stale_after_s,
        window_start=from_us(last_us),
        window_end=from_us(wm_us),
        ts=from_us(wm_us),
        message=(
            f"run {run_id} has no terminal event {(wm_us - last_us) / 1e6:.0f}s after its last one"
            if state == "firing"
            else f"run {run_id} reached its terminal after being marked incomplete"
        ),
        version=1 if state == "firing" else 2,
    )


def alert_record(row: AlertRow) -> OutRecord:
    """The ``prism.alerts`` record of an alert row (key = alert id, the idempotency key)."""
    value = {
        "alertId": row.alert_id,
        "rule": row.rule,
        "state": row.state,
        "tenantId": row.tenant_id,
        "key": row.key,
        "value": row.value,
        "threshold": row.threshold,
        "windowStart": row.window_start.isoformat(),
        "windowEnd": row.window_end.isoformat(),
        "ts": row.ts.isoformat(),
        "message": row.message,
        "version": row.version,
    }
    return OutRecord(key=row.alert_id.encode(), value=orjson.dumps(value))


# -- the limit-deaths topic: what the worker's partitions send the one alerter -------------


def reports_watermark(
    lanes: Mapping[int, LaneReport], expected: Collection[int] | None
) -> int | None:
    """The pipeline-wide watermark of the lanes' latest reports (rule 16); None until every
    ``expected`` lane has reported. A lane still reading may yet send rows at its mark, and
    a run waiting to close dies at its terminal's time: the watermark stays just before
    either."""
    if not lanes or (expected is not None and not set(expected) <= set(lanes)):
        return None
    reports = [r for lane, r in lanes.items() if expected is None or lane in expected]
    top = max(r.mark_us for r in reports)
    held = [r.mark_us - 1 for r in reports if not r.idle]
    held += [r.pending_us - 1 for r in reports if r.pending_us is not None]
    held += [r.hold_us - 1 for r in reports if r.hold_us is not None]  # copies on their way
    return min(top, *held) if held else top


def decision_time(
    lanes: Mapping[int, LaneReport],
    expected: Collection[int] | None,
    watermark_us: int,
    lateness_us: int,
    *,
    final: bool,
) -> tuple[int, int | None]:
    """The watermark after these reports (it never moves back), and the time a decider may
    decide up to: the watermark less the allowed lateness, or the watermark itself at
    ``final`` (end of input) or when every lane is quiet with no run waiting to close;
    None while not every expected lane has reported."""
    wm = reports_watermark(lanes, expected)
    if wm is not None:
        watermark_us = max(watermark_us, wm)
    elif not final:
        return watermark_us, None
    reports = lanes.values()
    settled = final or (
        bool(reports)
        and all(r.quiet and r.pending_us is None and r.hold_us is None for r in reports)
    )
    return watermark_us, watermark_us if settled else watermark_us - lateness_us


def death_record(death: LimitDeath) -> OutRecord:
    """A limit death (or its retraction) for the single-partition ``<prefix>.limit-deaths``
    topic."""
    value: dict[str, Any] = {
        "tenantId": death.tenant_id,
        "axis": death.axis,
        "runId": death.run_id,
        "ts": death.ts.isoformat(),
    }
    if death.retract:
        value["retract"] = True
    return OutRecord(key=death.run_id.encode(), value=orjson.dumps(value))


def lane_record(
    lane: int, report: LaneReport, at: float = 0.0, copies: int | None = None
) -> OutRecord:
    """A lane's event-time report, sent at processing time ``at``: the alerter and every
    worker take the pipeline watermark from these. ``copies``: the lane's position in its
    repartition partition, so a process that forwarded copies there knows when they were
    applied."""
    value: dict[str, object] = {
        "lane": lane,
        "mark": report.mark_us,
        "pending": report.pending_us,
        "idle": report.idle,
        "quiet": report.quiet,
        "at": at,
    }
    if copies is not None:
        value["copies"] = copies
    if report.hold_us is not None:
        value["hold"] = report.hold_us
    return OutRecord(key=b"lane:%d" % lane, value=orjson.dumps(value))


def decode_alerter_input(
    values: Iterable[bytes | None],
) -> tuple[list[LimitDeath], dict[int, LaneReport]]:
    """The deaths (in order) and each lane's latest report in a batch of ``limit-deaths``
    record values."""
    deaths: list[LimitDeath] = []
    reports: dict[int, LaneReport] = {}
    for raw in values:
        d = orjson.loads(raw or b"{}")
        if "lane" in d:
            hold = d.get("hold")
            reports[int(d["lane"])] = LaneReport(
                int(d["mark"]),
                d["pending"],
                bool(d["idle"]),
                bool(d["quiet"]),
                None if hold is None else int(hold),
            )
        elif "runId" in d:
            deaths.append(
                LimitDeath(
                    d["tenantId"],
                    d["axis"],
                    d["runId"],
                    datetime.fromisoformat(d["ts"]),
                    bool(d.get("retract", False)),
                )
            )
    return deaths, reports
