"""The worker's alerter: decided rows out, its state written only while it holds limit-deaths."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from prism.pipeline.core import LaneReport, LimitDeath, death_record, lane_record
from prism.pipeline.core._run import to_us
from prism.pipeline.settings import Settings
from prism.pipeline.worker._alerter import STATE_KEY, AlertDesk

T0 = datetime(2026, 11, 30, tzinfo=UTC)


class _Producer:
    def __init__(self) -> None:
        self.sent: list[Any] = []

    async def send_all(self, records: list[Any]) -> None:
        self.sent += records


def _desk(tmp_path: Any, changelog: dict[bytes, bytes]) -> tuple[AlertDesk, _Producer]:
    settings = Settings(state_dir=tmp_path, partitions=1, alert_limit_deaths_threshold=2,
                        grace_period_seconds=0.0)  # fmt: skip
    producer = _Producer()
    desk = AlertDesk(settings, settings.core_config(), producer)  # type: ignore[arg-type]

    async def read(partition: int) -> dict[bytes, bytes]:
        return dict(changelog)

    desk.reader.read = read  # type: ignore[method-assign]
    return desk, producer


def _values(deaths: int, mark_s: float) -> list[bytes]:
    values = [
        death_record(LimitDeath("acme", "maxTurns", f"r{i}", T0 + timedelta(seconds=i))).value
        for i in range(deaths)
    ]
    mark = to_us(T0 + timedelta(seconds=mark_s))
    return [*values, lane_record(0, LaneReport(mark, None, idle=True), 1.0).value]


def test_the_desk_decides_at_the_watermark_and_saves_only_while_it_holds_the_partition(
    tmp_path: Any,
) -> None:
    changelog: dict[bytes, bytes] = {}
    desk, producer = _desk(tmp_path, changelog)

    async def go() -> None:
        out = await desk.step(_values(2, 10), 0, 2)
        assert [r.state for r in out.ledger.alerts] == ["firing"]
        assert out.ranges == [(desk.topic, 0, 0, 2)] and len(out.alerts) == 1
        await desk.save(still_held=True)
        (state,) = producer.sent
        assert (state.topic, state.key, state.partition) == (desk.changelog, STATE_KEY, 0)
        changelog[STATE_KEY] = state.value
        await desk.save(still_held=False)  # reassigned: nothing written, the copy forgotten
        assert len(producer.sent) == 1 and desk.alerter is None
        # the next holder reads the state back: the firing is not decided twice
        again, _ = _desk(tmp_path, changelog)
        assert (await again.step(_values(2, 10), 0, 2)).ledger.alerts == []

    asyncio.run(go())
