"""The worker's alerter: decided rows out, its state as a record for its slot's transaction."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from prism.pipeline.core import LaneReport, LimitDeath, death_record, lane_record
from prism.pipeline.core._run import to_us
from prism.pipeline.settings import Settings
from prism.pipeline.worker._alerter import STATE_KEY, AlertDesk

T0 = datetime(2026, 11, 30, tzinfo=UTC)


def _desk(tmp_path: Any, changelog: dict[bytes, bytes]) -> AlertDesk:
    settings = Settings(state_dir=tmp_path, partitions=1, alert_limit_deaths_threshold=2,
                        grace_period_seconds=0.0)  # fmt: skip
    desk = AlertDesk(settings, settings.core_config())

    async def read(partition: int) -> dict[bytes, bytes]:
        return dict(changelog)

    desk.reader.read = read  # type: ignore[method-assign]
    return desk


def _values(deaths: int, mark_s: float) -> list[bytes]:
    values = [
        death_record(LimitDeath("acme", "maxTurns", f"r{i}", T0 + timedelta(seconds=i))).value
        for i in range(deaths)
    ]
    mark = to_us(T0 + timedelta(seconds=mark_s))
    return [*values, lane_record(0, LaneReport(mark, None, idle=True), 1.0).value]


def test_the_desk_decides_at_the_watermark_and_its_next_holder_reads_its_state_back(
    tmp_path: Any,
) -> None:
    changelog: dict[bytes, bytes] = {}
    desk = _desk(tmp_path, changelog)

    async def go() -> None:
        assert desk.state_record() is None  # nothing stepped: nothing to write
        out = await desk.step(_values(2, 10), 0, 2)
        assert [r.state for r in out.ledger.alerts] == ["firing"]
        assert out.ranges == [(desk.topic, 0, 0, 2)] and len(out.alerts) == 1
        state = desk.state_record()
        assert state is not None
        assert (state.topic, state.key, state.partition) == (desk.changelog, STATE_KEY, 0)
        changelog[STATE_KEY] = state.value or b""  # the transaction committed it
        desk.forget()  # fenced or reassigned: the copy in memory is gone
        assert desk.alerter is None and desk.state_record() is None
        # the next holder reads the state back: the firing is not decided twice
        again = _desk(tmp_path, changelog)
        assert (await again.step(_values(2, 10), 0, 2)).ledger.alerts == []
        # without the state, the same deaths fire again: the state is what prevents it
        fresh = _desk(tmp_path, {})
        assert len((await fresh.step(_values(2, 10), 0, 2)).ledger.alerts) == 1

    asyncio.run(go())
