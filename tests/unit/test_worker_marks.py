"""One watermark across processes: remote lanes in the clock, the lane-marks reader's reports."""

from __future__ import annotations

from prism.pipeline.core import EventClock, LaneReport, lane_record
from prism.pipeline.worker._marks import REPORT_EXPIRY_S, LaneMarks, decode_lane_mark


def test_remote_lanes_move_the_watermark_and_hold_it_back_while_reading() -> None:
    clock = EventClock()
    clock.set_mark(0, 100)  # this process's only lane, caught up
    assert clock.watermark_us == 100
    clock.remote(1, 500, idle=True)  # another process's lane moved on: time moves here too
    assert clock.watermark_us == 500
    clock.remote(2, 300, idle=False)  # one still reading holds it back
    assert clock.watermark_us == 300
    clock.forget_remote(2)
    assert clock.watermark_us == 500
    clock.forget_remote(1)
    assert clock.watermark_us == 100


def test_the_reader_keeps_each_lanes_latest_report_and_drops_expired_or_held_ones() -> None:
    marks = LaneMarks("p.lane-marks", {})
    now = 1_000.0
    marks.take(lane_record(1, LaneReport(200, None, idle=False), now - 1).value)
    marks.take(lane_record(1, LaneReport(400, None, idle=True), now).value)  # replaces it
    marks.take(lane_record(2, LaneReport(900, None, idle=True), now - REPORT_EXPIRY_S - 1).value)
    marks.take(lane_record(3, LaneReport(50, None, idle=False), now).value)
    marks.take(b"not json")  # a record that is no report changes nothing
    clock = EventClock()
    clock.set_mark(3, 60)
    marks.apply(clock, held={3}, now=now)
    # lane 2 expired (its owner stopped), lane 3 is this process's own
    assert clock.watermark_us == 400
    marks.apply(clock, held={1, 3}, now=now)  # lane 1 was assigned here since
    assert clock.watermark_us == 60


def test_a_report_round_trips_through_its_record() -> None:
    report = LaneReport(123, 45, idle=True, quiet=False)
    assert decode_lane_mark(lane_record(7, report, 9.5).value) == (7, report, 9.5)
    assert decode_lane_mark(b'{"lane": 1}') is None
