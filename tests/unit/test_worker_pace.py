"""The worker's batch pace (records per fetch bounded in time) and its event-loop watch."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from prism.pipeline.worker._loopwatch import Laps, LoopWatch
from prism.pipeline.worker._pace import BatchPace


def test_pace_starts_small_and_grows_to_what_fits_the_target() -> None:
    pace = BatchPace(20_000, target_s=2.5)
    assert pace.limit() == 500  # a process's first batch is its slowest
    limits = []
    for _ in range(30):  # 1 s per batch for the insert and the transactions, 0.1 ms a record
        limits.append(pace.limit())
        pace.took(limits[-1], 1.0 + limits[-1] * 0.0001)
    assert limits == sorted(limits)
    assert 1.0 + limits[-1] * 0.0001 == pytest.approx(2.5, rel=0.05)  # a batch fills its target


def test_pace_shrinks_batches_to_what_fits_the_target_on_a_slow_worker() -> None:
    pace = BatchPace(20_000, target_s=2.5, least=100)
    pace.took(20_000, 40.0)  # 500 records/s: a 20k batch would hold a rebalance 40 s
    assert pace.limit() == 1_250
    for _ in range(30):  # the smaller batches run at the same per-record cost
        pace.took(pace.limit(), pace.limit() / 500)
    assert pace.limit() == 1_250


def test_pace_grows_back_to_the_most_when_the_worker_is_fast_again() -> None:
    pace = BatchPace(20_000, target_s=2.5, least=100)
    pace.took(20_000, 40.0)
    limits = []
    for _ in range(40):  # 50,000 records/s now
        pace.took(pace.limit(), pace.limit() / 50_000)
        limits.append(pace.limit())
    assert limits == sorted(limits) and limits[-1] == 20_000


def test_pace_never_goes_below_the_least_nor_above_the_most() -> None:
    pace = BatchPace(3_000, target_s=1.0, least=500)
    pace.took(10, 60.0)  # 6 s per record: a stuck insert
    assert pace.limit() == 500
    assert BatchPace(300, target_s=1.0, least=500).limit() == 300  # least capped by most


def test_pace_ignores_empty_batches_and_moves_its_estimate_by_the_weight() -> None:
    pace = BatchPace(100_000, target_s=1.0, least=1, weight=0.5)
    pace.took(0, 5.0)
    assert pace.per_record_s is None
    pace.took(1_000, 1.0)
    pace.took(1_000, 3.0)
    assert pace.per_record_s == pytest.approx(0.002)
    assert pace.limit() == 500


def test_pace_keeps_its_estimate_through_a_quiet_spell_of_small_batches() -> None:
    """A batch of a few records takes what every batch pays (0.3 s here): divided by its
    records it made a record look 50 times dearer, and cut the next burst into batches of
    ``least`` until the estimate came back."""
    pace = BatchPace(20_000, target_s=2.5)
    for _ in range(5):  # busy: 0.3 s a batch, 0.1 ms a record
        pace.took(pace.limit(), 0.3 + pace.limit() * 0.0001)
    busy = pace.limit()
    assert busy > 5_000
    for _ in range(50):  # quiet: a few records a batch
        pace.took(6, 0.3 + 6 * 0.0001)
    assert pace.limit() == busy  # the burst after it is taken at the busy pace


def test_pace_learns_from_the_first_batch_of_least_records_not_from_a_warm_up() -> None:
    pace = BatchPace(20_000, target_s=2.5)
    for _ in range(3):  # a warm-up: 20 records, 0.3 s a batch
        pace.took(20, 0.3 + 20 * 0.0001)
    assert pace.per_record_s is None and pace.limit() == 500
    pace.took(500, 0.3 + 500 * 0.0001)  # the first batch of the load
    assert pace.limit() == int(2.5 / (0.35 / 500))  # 3,571: fit at once, not over 8 batches


def test_pace_learns_from_a_live_streams_first_batches_a_few_records_short_of_least() -> None:
    """A live stream's fetch hands over what is in hand: at 5,000 events/s the first
    batches were 497, 498 and 497 records, and the pace stayed at 500 while the backlog
    grew. A batch of at least half its limit counts; the warm-up's 20 records still do not."""
    pace = BatchPace(20_000, target_s=2.5)
    pace.took(20, 0.3 + 20 * 0.0001)
    assert pace.per_record_s is None
    pace.took(497, 0.3 + 497 * 0.0001)
    assert pace.limit() == int(2.5 / ((0.3 + 497 * 0.0001) / 497))  # 3,553
    busy = pace.limit()
    pace.took(200, 0.3 + 200 * 0.0001)  # fewer than least and than half the limit
    assert pace.limit() == busy


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"most": 0, "target_s": 1.0}, "most must be at least 1, not 0"),
        ({"most": 10, "target_s": -2.0}, "target_s must be positive, not -2.0"),
        ({"most": 10, "target_s": 1.0, "weight": 1.5}, "weight must be in (0, 1], not 1.5"),
    ],
)
def test_pace_refuses_a_bad_setting_naming_it(kwargs: dict[str, float], named: str) -> None:
    with pytest.raises(ValueError, match=named.replace("(", r"\(").replace(")", r"\)")):
        BatchPace(**kwargs)  # type: ignore[arg-type]


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_loop_watch_logs_one_warning_per_episode_and_keeps_the_longest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = _Clock()
    watch = LoopWatch(warn_s=2.0, tick_s=0.25, clock=clock)
    caplog.set_level(logging.WARNING, "prism.worker")
    clock.now = 101.5
    assert watch.check() == pytest.approx(1.5) and watch.episodes == 0
    clock.now = 103.0
    watch.check()
    clock.now = 109.0
    watch.check()  # the same episode: no second warning
    assert watch.episodes == 1
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "the event loop has not turned for 3.0s"
    ]
    clock.now = 110.0
    watch.beat()
    watch.check()
    assert watch.longest_s == pytest.approx(10.0)
    assert caplog.records[-1].getMessage() == "the event loop turned again after 10.0s"
    clock.now = 113.0  # a second, shorter episode
    watch.check()
    clock.now = 113.5
    watch.beat()
    watch.check()
    assert watch.episodes == 2 and watch.longest_s == pytest.approx(10.0)


def test_loop_watch_names_where_a_real_loop_is_held(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "prism.worker")

    def hold_the_loop() -> None:
        time.sleep(1.5)  # a synchronous call on the loop

    async def main() -> LoopWatch:
        watch = LoopWatch(warn_s=0.5, tick_s=0.1)
        watch.start()
        await asyncio.sleep(0.3)
        hold_the_loop()
        for _ in range(100):  # until the watch sees the loop turn again
            if watch.longest_s:
                break
            await asyncio.sleep(0.1)
        watch.stop()
        return watch

    watch = asyncio.run(main())
    assert watch.episodes == 1 and watch.longest_s >= 1.0
    held = next(r.getMessage() for r in caplog.records if "has not turned" in r.getMessage())
    assert "hold_the_loop" in held and "time.sleep(1.5)" in held


def test_loop_watch_refuses_a_warning_below_its_tick() -> None:
    with pytest.raises(ValueError, match=r"warn_s \(0.1\) must be above tick_s \(0.25\)"):
        LoopWatch(warn_s=0.1)


def test_laps_add_up_by_name_and_name_the_longest_parts_first() -> None:
    now = [0.0]
    laps = Laps(clock=lambda: now[0])
    for name, took in [("positions", 2.0), ("step", 0.05), ("transactions", 3.0),
                       ("positions", 1.5)]:  # fmt: skip
        now[0] += took
        laps.lap(name)
    assert laps.parts == pytest.approx({"positions": 3.5, "step": 0.05, "transactions": 3.0})
    assert str(laps) == "positions 3.5s, transactions 3.0s"  # under 0.1 s: not named
    laps.note("the lanes' tick wrote 12 states")
    assert str(laps) == "positions 3.5s, transactions 3.0s; the lanes' tick wrote 12 states"
    assert str(Laps(clock=lambda: 0.0)) == "no part over 0.1s"
