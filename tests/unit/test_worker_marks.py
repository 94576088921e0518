"""One watermark across processes: remote lanes in the clock, the lane-marks reader's reports."""

from __future__ import annotations

from prism.pipeline.core import EventClock, LaneReport, lane_record
from prism.pipeline.worker._marks import LaneMarks, decode_lane_mark, heartbeat_s


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


def test_a_lane_with_records_waiting_and_no_mark_holds_like_a_remote_one() -> None:
    # copies on their way to a lane that has applied none yet: their time is unknown, so
    # nothing is decided past them, as for another process's lane reading without a mark
    local, remote = EventClock(), EventClock()
    for clock in (local, remote):
        clock.set_mark(0, 500)
    local.behind(7, True)
    remote.remote(7, 0, idle=False)
    assert local.watermark_us == remote.watermark_us == 0
    local.behind(7, False)  # applied: it holds no more
    assert local.watermark_us == 500


def test_the_reader_keeps_each_lanes_latest_report_and_leaves_held_ones_to_this_process() -> None:
    marks = LaneMarks("p.lane-marks", {}, idle_expiry_s=10)
    now = 1_000.0
    marks.take(lane_record(1, LaneReport(200, None, idle=False), now - 1).value)
    marks.take(lane_record(1, LaneReport(400, None, idle=True), now).value)  # replaces it
    marks.take(lane_record(3, LaneReport(50, None, idle=False), now).value)
    marks.take(b"not json")  # a record that is no report changes nothing
    clock = EventClock()
    clock.set_mark(3, 60)
    marks.apply(clock, held={3}, now=now)  # lane 3 is this process's own
    assert clock.watermark_us == 400
    marks.apply(clock, held={1, 3}, now=now)  # lane 1 was assigned here since
    assert clock.watermark_us == 60


def test_a_lane_whose_owner_stopped_holds_the_watermark_until_its_next_owner_reports() -> None:
    marks = LaneMarks("p.lane-marks", {}, idle_expiry_s=10)
    now = 1_000.0
    marks.take(lane_record(1, LaneReport(900, None, idle=True), now).value)
    marks.take(lane_record(2, LaneReport(300, None, idle=False), now - 3_600).value)  # reading
    clock = EventClock()
    marks.apply(clock, held=(), now=now)
    assert clock.watermark_us == 300  # an hour-old report of a lane reading still holds
    marks.take(lane_record(2, LaneReport(700, None, idle=True), now).value)  # its next owner
    marks.apply(clock, held=(), now=now)
    assert clock.watermark_us == 900


def test_an_idle_report_older_than_the_session_timeout_is_no_longer_believed_idle() -> None:
    marks = LaneMarks("p.lane-marks", {}, idle_expiry_s=10)
    now = 1_000.0
    marks.take(lane_record(1, LaneReport(900, None, idle=True), now).value)
    marks.take(lane_record(2, LaneReport(300, None, idle=True), now - 11).value)  # owner gone?
    clock = EventClock()
    marks.apply(clock, held=(), now=now - 5)  # both fresh: idle lanes hold nothing
    assert clock.watermark_us == 900
    marks.apply(clock, held=(), now=now)  # lane 2 may have records its owner never read
    assert clock.watermark_us == 300


def test_reports_are_sent_again_three_times_per_session_timeout() -> None:
    assert heartbeat_s(10.0) * 3 == 10.0
    assert heartbeat_s(0.1) == 0.5  # never a flood


def test_a_report_round_trips_through_its_record() -> None:
    report = LaneReport(123, 45, idle=True, quiet=False)
    assert decode_lane_mark(lane_record(7, report, 9.5).value) == (7, report, 9.5)
    held = LaneReport(123, 45, idle=True, quiet=False, hold_us=99)  # copies on their way
    assert decode_lane_mark(lane_record(7, held, 9.5).value) == (7, held, 9.5)
    marks, clock = LaneMarks("p.lane-marks", {}), EventClock()
    marks.take(lane_record(7, held, 9.5).value)
    clock.set_mark(1, 500)
    marks.apply(clock, held={1}, now=9.5)
    assert clock.watermark_us == 99  # an idle lane whose process sent copies on holds
    assert decode_lane_mark(b'{"lane": 1}') is None
