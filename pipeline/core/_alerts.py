"""Run-limit exhaustion alerts: limit deaths per (tenant, axis) in a sliding event-time window.

When the deaths inside ``(t - window, t]`` reach the threshold, one alert fires for that
key (its id names the key and the time it fired); it resolves when the count in the window
ending at the watermark drops below the threshold. One instance sees every death (the
worker routes them through a single-partition topic), so counts are global.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import orjson

from prism.schemas import AlertRow

from ._run import from_us, to_us
from ._types import LimitDeath, OutRecord

__all__ = [
    "RULE_EXHAUSTION",
    "RULE_STALE",
    "ExhaustionAlerter",
    "alert_record",
    "death_record",
    "decode_alerter_input",
    "stale_alert",
    "watermark_record",
]

RULE_EXHAUSTION = "run_limit_exhaustion"
RULE_STALE = "stale_run"


@dataclass(slots=True)
class _Key:
    deaths: list[tuple[int, str]] = field(default_factory=list)  # sorted (event time us, run id)
    firing: dict[str, Any] | None = None  # {id, start_us, version}


class ExhaustionAlerter:
    """Sliding-window counter of limit deaths per (tenant, axis); emits firing/resolved rows."""

    def __init__(self, window_s: float, threshold: int) -> None:
        self.window_us = int(window_s * 1_000_000)
        self.threshold = threshold
        self.keys: dict[tuple[str, str], _Key] = {}
        self.watermark_us = 0

    def observe(self, deaths: list[LimitDeath]) -> list[AlertRow]:
        rows: list[AlertRow] = []
        for death in sorted(deaths, key=lambda d: (d.ts, d.run_id)):
            k = self.keys.setdefault((death.tenant_id, death.axis), _Key())
            ts = to_us(death.ts)
            if ts <= self.watermark_us - self.window_us or any(
                r == death.run_id for _, r in k.deaths
            ):
                continue  # already counted, or too old to count
            bisect.insort(k.deaths, (ts, death.run_id))
            self.watermark_us = max(self.watermark_us, ts)
            count = self._count(k, ts)
            if k.firing is None and count >= self.threshold:
                alert_id = (
                    f"{RULE_EXHAUSTION}:{death.tenant_id}:{death.axis}:{from_us(ts).isoformat()}"
                )
                k.firing = {"id": alert_id, "start_us": ts, "version": 1}
                rows.append(self._row((death.tenant_id, death.axis), k, "firing", ts, count))
        return rows

    def advance(self, watermark_us: int) -> list[AlertRow]:
        """Move event time forward: resolve keys whose window count dropped; prune old deaths."""
        self.watermark_us = max(self.watermark_us, watermark_us)
        wm = self.watermark_us
        rows: list[AlertRow] = []
        for key, k in self.keys.items():
            count = self._count(k, wm)
            if k.firing is not None and count < self.threshold:
                k.firing["version"] += 1
                rows.append(self._row(key, k, "resolved", wm, count))
                k.firing = None
            cut = bisect.bisect_right(k.deaths, (wm - self.window_us, "\uffff"))
            if cut:
                del k.deaths[:cut]
        for key in [key for key, k in self.keys.items() if not k.deaths and k.firing is None]:
            del self.keys[key]
        return rows

    def _count(self, k: _Key, at_us: int) -> int:
        lo = bisect.bisect_right(k.deaths, (at_us - self.window_us, "\uffff"))
        hi = bisect.bisect_right(k.deaths, (at_us, "\uffff"))
        return hi - lo

    def to_bytes(self) -> bytes:
        return orjson.dumps(
            {
                "w": self.window_us,
                "t": self.threshold,
                "wm": self.watermark_us,
                "k": [[list(key), k.deaths, k.firing] for key, k in self.keys.items()],
            }
        )

    @classmethod
    def from_bytes(cls, raw: bytes) -> ExhaustionAlerter:
        d = orjson.loads(raw)
        alerter = cls(d["w"] / 1_000_000, d["t"])
        alerter.watermark_us = d["wm"]
        for key, deaths, firing in d["k"]:
            alerter.keys[(key[0], key[1])] = _Key([(ts, run) for ts, run in deaths], firing)
        return alerter

    def _row(self, key: tuple[str, str], k: _Key, state: str, at_us: int, count: int) -> AlertRow:
        assert k.firing is not None
        tenant, axis = key
        window_end = from_us(at_us)
        return AlertRow(
            alert_id=k.firing["id"],
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
            version=k.firing["version"],
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


def death_record(death: LimitDeath) -> OutRecord:
    """A limit death for the single-partition ``<prefix>.limit-deaths`` topic."""
    value = {
        "tenantId": death.tenant_id,
        "axis": death.axis,
        "runId": death.run_id,
        "ts": death.ts.isoformat(),
    }
    return OutRecord(key=f"{death.tenant_id}|{death.axis}".encode(), value=orjson.dumps(value))


def watermark_record(partition: int, watermark_us: int) -> OutRecord:
    """A partition's event-time watermark, so the alerter resolves alerts as time passes."""
    return OutRecord(key=b"wm", value=orjson.dumps({"wm": watermark_us, "p": partition}))


def decode_alerter_input(values: list[bytes]) -> tuple[list[LimitDeath], int]:
    """The deaths and the highest watermark in a batch of ``limit-deaths`` record values."""
    deaths: list[LimitDeath] = []
    wm = 0
    for raw in values:
        d = orjson.loads(raw or b"{}")
        if "wm" in d:
            wm = max(wm, int(d["wm"]))
        else:
            deaths.append(
                LimitDeath(d["tenantId"], d["axis"], d["runId"], datetime.fromisoformat(d["ts"]))
            )
    return deaths, wm
