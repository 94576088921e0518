"""The alerts a correct pipeline raises for a fleet: limit-death exhaustion and stale runs.

Exhaustion: a *limit death* is a run closed by ``error`` that has an accepted
``run_limit_exceeded``; its axis is that record's ``limit`` (the highest-seq one), its
tenant the run's owner, its time the terminal's ``ts``. For each (tenant, axis), count the
deaths in the sliding window ``(t - window, t]``; an alert fires at every death that lifts
the count to the threshold while none is firing, and the firing ends when the count drops
below the threshold again (a death leaves the window ``window`` after it happened). Deaths
stamped beyond the pipeline clock plus the allowed skew never count (rule 14).

Stale: one ``stale_run`` alert per run that is ``incomplete``.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

__all__ = ["LimitDeath", "exhaustion_alerts"]

RULE_EXHAUSTION = "run_limit_exhaustion"

# (tenant, axis, run id, terminal ts in ms)
LimitDeath = tuple[str, str, str, int]


def _iso(ms: int) -> str:
    return (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)).isoformat()


def exhaustion_alerts(
    deaths: list[LimitDeath], window_ms: int, threshold: int
) -> list[dict[str, Any]]:
    """Every firing of the exhaustion alert, in time order (see the module docstring)."""
    by_key: dict[tuple[str, str], list[tuple[int, str]]] = defaultdict(list)
    for tenant, axis, run_id, ms in deaths:
        by_key[(tenant, axis)].append((ms, run_id))
    alerts = []
    for (tenant, axis), items in sorted(by_key.items()):
        # Sweep: +1 at each death, -1 when it leaves the window; equal times apply together.
        changes: dict[int, int] = defaultdict(int)
        for ms, _ in items:
            changes[ms] += 1
            changes[ms + window_ms] -= 1
        count = 0
        firing = False
        for at in sorted(changes):
            count += changes[at]
            if not firing and count >= threshold:
                firing = True
                alerts.append(
                    {
                        "rule": RULE_EXHAUSTION,
                        "tenant_id": tenant,
                        "key": axis,
                        "fired_at": _iso(at),
                        "count": count,
                        "alert_id": f"{RULE_EXHAUSTION}:{tenant}:{axis}:{_iso(at)}",
                        "run_ids": sorted(r for ms, r in items if at - window_ms < ms <= at),
                    }
                )
            elif firing and count < threshold:
                firing = False
    return sorted(alerts, key=lambda a: (a["fired_at"], a["tenant_id"], a["key"]))
