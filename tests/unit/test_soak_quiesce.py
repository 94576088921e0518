"""The soak stops its workers only once they decided everything up to the final watermark.

Committing every record is not enough: when the last busy lane goes idle, the pipeline's
watermark jumps to the newest event time, and the next ticks mark runs stale and send
the deaths the alerter decides on. A soak that stopped its workers a few seconds after
the last commit found 4,921 runs `running` that the manifest has `incomplete`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prism.devstack.soak import _clocks


@dataclass
class _Slot:
    name: str
    root: Path


class _Pool:
    def __init__(self, slots: list[_Slot]) -> None:
        self.slots = slots

    def live(self) -> list[_Slot]:
        return self.slots


def _pool(tmp_path: Path, *stats: dict[str, Any]) -> _Pool:
    slots = []
    for i, st in enumerate(stats):
        slot = _Slot(f"w{i + 1}", tmp_path / f"w{i + 1}")
        (slot.root / "state").mkdir(parents=True)
        doc = {"updated_at": time.time(), **st}
        (slot.root / "state" / "worker-stats.json").write_text(json.dumps(doc))
        slots.append(slot)
    return _Pool(slots)


def _w(mark: int, top: int | None = None, **alerter: int) -> dict[str, Any]:
    return {"watermark_us": mark, "top_us": mark if top is None else top, **alerter}


def test_workers_on_one_unheld_watermark_with_the_alerter_decided_are_settled(
    tmp_path: Path,
) -> None:
    alerter = {"alerts_watermark_us": 90, "alerts_decided_us": 90}
    pool = _pool(tmp_path, _w(100), _w(100, **alerter), _w(100))
    assert _clocks(pool, time.time() - 60) == (100, ("w2", 90))  # type: ignore[arg-type]


def test_a_held_watermark_a_split_view_or_an_undecided_alerter_is_not_settled(
    tmp_path: Path,
) -> None:
    decided = {"alerts_watermark_us": 100, "alerts_decided_us": 100}
    cases = {
        "held back": (_w(80, top=100, **decided), _w(100)),
        "two watermarks": (_w(100, **decided), _w(90)),
        "alerter behind": (_w(100, alerts_watermark_us=100, alerts_decided_us=40), _w(100)),
        "no alerter": (_w(100), _w(100)),
    }
    for i, (name, stats) in enumerate(cases.items()):
        pool = _pool(tmp_path / str(i), *stats)
        assert _clocks(pool, time.time() - 60) is None, name  # type: ignore[arg-type]


def test_stats_written_before_the_drain_do_not_count(tmp_path: Path) -> None:
    decided = {"alerts_watermark_us": 100, "alerts_decided_us": 100}
    pool = _pool(tmp_path, _w(100, **decided), _w(100))
    assert _clocks(pool, time.time() + 60) is None  # type: ignore[arg-type]
