"""The exhaustion alert of rule 16: a function of the set of deaths, decided at the watermark.

The oracle is the simulator's manifest sweep (``exhaustion_alerts``) over the whole set;
the alerter sees the same deaths split over lanes, batches, restarts and re-deliveries,
in any order a pipeline can deliver them, and must give exactly its firings.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from prism.pipeline.core import ExhaustionAlerter, LaneReport, LimitDeath, decision_time
from prism.pipeline.core._alerts import reports_watermark
from prism.pipeline.core._run import to_us
from prism.runtime.simulator._expected_alerts import exhaustion_alerts

T0 = datetime(2026, 11, 30, tzinfo=UTC)
WINDOW_S, THRESHOLD = 300, 3


def death(run: str, at_s: float, tenant: str = "acme", axis: str = "maxTurns") -> LimitDeath:
    return LimitDeath(tenant, axis, run, T0 + timedelta(seconds=at_s))


def us(at_s: float) -> int:
    return to_us(T0 + timedelta(seconds=at_s))


def alerter(lateness_s: float = 0.0, lanes: list[int] | None = None) -> ExhaustionAlerter:
    return ExhaustionAlerter(WINDOW_S, THRESHOLD, lateness_s, lanes)


def test_fires_at_the_death_that_reaches_the_threshold_and_resolves_when_one_leaves() -> None:
    a = alerter()
    a.observe([death(f"r{i}", i * 10) for i in range(5)])
    a.report(0, LaneReport(us(25)))  # deaths at 0, 10, 20 s are behind the watermark
    (fired,) = a.decide()
    assert (fired.state, fired.ts, fired.value) == ("firing", T0 + timedelta(seconds=20), 3.0)
    assert fired.alert_id == f"run_limit_exhaustion:acme:maxTurns:{fired.ts.isoformat()}"
    a.report(0, LaneReport(us(1000), idle=True))
    (resolved,) = a.decide()
    # deaths at 0..40 s; the count drops below 3 when the third-last leaves: 20 s + 300 s
    assert (resolved.state, resolved.ts, resolved.version) == (
        "resolved",
        T0 + timedelta(seconds=320),
        2,
    )
    assert resolved.alert_id == fired.alert_id


def test_nothing_is_decided_at_arrival_only_when_the_watermark_passes() -> None:
    a = alerter(lateness_s=30)
    a.observe([death(f"r{i}", i) for i in range(3)])
    a.report(0, LaneReport(us(10)))
    assert a.decide() == []  # 2 s is not yet 30 s behind the watermark
    a.report(0, LaneReport(us(32)))  # a lane still reading may yet send more at 32 s
    assert a.decide() == []
    a.report(0, LaneReport(us(32.000001)))
    assert [r.state for r in a.decide()] == ["firing"]


def test_a_lane_not_idle_holds_the_watermark_and_an_idle_one_does_not() -> None:
    a = alerter(lanes=[0, 1])
    a.observe([death(f"r{i}", i) for i in range(3)])
    a.report(0, LaneReport(us(100)))
    assert a.decide() == []  # lane 1 has not reported: its deaths may still come
    a.report(1, LaneReport(us(1)))
    assert a.decide() == []  # lane 1 is behind at 1 s
    a.report(1, LaneReport(us(1), idle=True))
    assert [r.state for r in a.decide()] == ["firing"]


def test_a_run_waiting_to_close_holds_the_watermark_at_its_terminal() -> None:
    a = alerter()
    a.observe([death("r0", 0), death("r1", 1)])
    a.report(0, LaneReport(us(500), pending_us=us(2), idle=True))
    assert a.decide() == []
    a.observe([death("r2", 2)])  # the run closed: its death, then the lane's new report
    a.report(0, LaneReport(us(500), idle=True))
    assert [(r.state, r.ts) for r in a.decide()] == [
        ("firing", T0 + timedelta(seconds=2)),
        ("resolved", T0 + timedelta(seconds=300)),
    ]


def test_a_quiet_stream_decides_up_to_the_watermark_itself() -> None:
    a = alerter(lateness_s=30)
    a.observe([death(f"r{i}", 100 + i) for i in range(3)])
    a.report(0, LaneReport(us(102), idle=True))
    assert a.decide() == []  # within the allowed lateness of the watermark
    a.report(0, LaneReport(us(102), idle=True, quiet=True))
    assert [r.state for r in a.decide()] == ["firing"]


def test_a_retracted_or_moved_death_no_longer_counts() -> None:
    a = alerter()
    a.observe([death("r0", 0), death("r1", 1), death("r2", 2)])
    a.observe([LimitDeath("acme", "maxTurns", "r2", T0 + timedelta(seconds=2), retract=True)])
    a.observe([death("r1", 1, tenant="other")])  # its owner was re-stated
    a.report(0, LaneReport(us(1000), idle=True))
    assert a.decide() == []
    assert a.late == 0


def test_a_death_later_than_the_allowed_lateness_is_counted_late_and_reopens_nothing() -> None:
    a = alerter()
    a.observe([death("r0", 0), death("r1", 1)])
    a.report(0, LaneReport(us(100), idle=True))
    assert a.decide() == []
    a.observe([death("r2", 2)])  # 2 s was decided at 100 s
    a.report(0, LaneReport(us(101), idle=True))
    assert a.decide() == []
    assert a.late == 1


def test_re_delivered_deaths_and_reports_change_nothing() -> None:
    a = alerter()
    batch = [death(f"r{i}", i) for i in range(3)]
    a.observe(batch)
    a.report(0, LaneReport(us(10)))
    first = a.decide()
    a.observe(batch)
    a.report(0, LaneReport(us(10)))
    assert [r.state for r in first] == ["firing"]
    assert a.decide() == [] and a.late == 0


def test_state_round_trips_and_an_older_format_is_refused_by_name() -> None:
    a = alerter(lateness_s=5, lanes=[0])
    a.observe([death(f"r{i}", i) for i in range(4)])
    a.report(0, LaneReport(us(3)))
    b = ExhaustionAlerter.from_bytes(a.to_bytes())
    b.report(0, LaneReport(us(3600), idle=True))
    assert [r.state for r in b.decide()] == ["firing", "resolved"]
    try:
        ExhaustionAlerter.from_bytes(b'{"w": 1, "t": 1, "wm": 0, "k": []}')
    except ValueError as exc:
        assert "format None" in str(exc)
    else:
        raise AssertionError("an alerter state without a format version was read")


# -- the property: any delivery a pipeline can make gives the sweep's firings ---------------


def _oracle(deaths: list[LimitDeath]) -> list[tuple[str, str]]:
    ms = [(d.tenant_id, d.axis, d.run_id, to_us(d.ts) // 1000) for d in deaths]
    firings = exhaustion_alerts(ms, WINDOW_S * 1000, THRESHOLD)
    return sorted((a["alert_id"], a["fired_at"]) for a in firings)


def _resolves(deaths: list[LimitDeath], until_us: int) -> int:
    """How many firings the sweep ends at or before ``until_us`` (brute force)."""
    n = 0
    for key in {(d.tenant_id, d.axis) for d in deaths}:
        times = sorted(to_us(d.ts) for d in deaths if (d.tenant_id, d.axis) == key)
        w = WINDOW_S * 1_000_000
        firing = False
        for at in sorted(set(times) | {t + w for t in times}):
            if at > until_us:
                break
            count = sum(1 for t in times if at - w < t <= at)
            if not firing and count >= THRESHOLD:
                firing = True
            elif firing and count < THRESHOLD:
                firing, n = False, n + 1
    return n


@st.composite
def deliveries(draw: st.DrawFn) -> tuple[list[LimitDeath], list[list[tuple[str, object]]]]:
    """A set of deaths and, for each lane, the chunks a pipeline could send of it: each
    chunk's deaths, then the lane's report (mark = latest time seen, held back by the
    earliest death not yet sent, as a run waiting to close holds it)."""
    n = draw(st.integers(0, 24))
    lanes = draw(st.integers(1, 3))
    deaths = [
        LimitDeath(
            draw(st.sampled_from(["acme", "globex"])),
            draw(st.sampled_from(["maxTurns", "maxCost"])),
            f"run-{i}",
            T0 + timedelta(seconds=draw(st.integers(0, 1500))),
        )
        for i in range(n)
    ]
    per_lane: list[list[LimitDeath]] = [[] for _ in range(lanes)]
    for d in deaths:
        per_lane[draw(st.integers(0, lanes - 1))].append(d)
    streams: list[list[tuple[str, object]]] = []
    for lane, mine in enumerate(per_lane):
        mine = draw(st.permutations(mine))  # runs close out of terminal order
        items: list[tuple[str, object]] = []
        mark = 0
        i = 0
        while i < len(mine):
            size = draw(st.integers(1, 4))
            chunk, i = mine[i : i + size], i + size
            mark = max([mark, *(to_us(d.ts) for d in chunk)])
            rest = [to_us(d.ts) for d in mine[i:]]
            items += [("death", d) for d in chunk]
            items.append(("report", (lane, LaneReport(mark, min(rest) if rest else None))))
        streams.append(items)
    return deaths, streams


@settings(max_examples=150, deadline=None)
@given(deliveries(), st.data())
def test_firings_are_the_manifest_sweep_whatever_the_delivery(
    case: tuple[list[LimitDeath], list[list[tuple[str, object]]]], data: st.DataObject
) -> None:
    deaths, streams = case
    lanes = len(streams)
    a = ExhaustionAlerter(WINDOW_S, THRESHOLD, 0.0, range(lanes))
    rows = []
    # interleave the lanes' streams (one topic partition keeps each lane's order)
    queues = [list(s) for s in streams]
    sent: list[tuple[str, object]] = []
    while any(queues):
        q = data.draw(st.sampled_from([q for q in queues if q]))
        sent.append(q.pop(0))
    pos = 0
    while pos < len(sent):
        size = data.draw(st.integers(1, 6))
        batch, pos = sent[pos : pos + size], pos + size
        if data.draw(st.booleans()):  # a restart: the state as stored, then re-delivery
            a = ExhaustionAlerter.from_bytes(a.to_bytes())
            if data.draw(st.booleans()):
                batch = sent[max(0, pos - size - 3) : pos]
        for kind, item in batch:
            if kind == "death":
                assert isinstance(item, LimitDeath)
                a.observe([item])
            else:
                lane, report = item  # type: ignore[misc]
                a.report(lane, report)
        rows += a.decide()
    for lane in range(lanes):  # every lane caught up and quiet: the stream ended
        mark = a.lanes[lane].mark_us if lane in a.lanes else 0
        a.report(lane, LaneReport(mark, None, idle=True, quiet=True))
    rows += a.decide()
    fired = sorted((r.alert_id, r.ts.isoformat()) for r in rows if r.state == "firing")
    assert fired == _oracle(deaths)
    assert len({r.alert_id for r in rows if r.state == "firing"}) == len(fired)
    resolved = [r for r in rows if r.state == "resolved"]
    assert len(resolved) == _resolves(deaths, a.watermark_us)
    assert a.late == 0


def test_copies_another_process_sent_on_hold_the_alerters_watermark_and_survive_its_state() -> None:
    # an idle lane whose process forwarded a copy (maybe a terminal: a death to come) that
    # its home lane, on another process, has not applied yet: nothing is decided past it
    lanes = {0: LaneReport(5_000, None, idle=True, quiet=True),
             1: LaneReport(9_000, None, idle=True, quiet=True, hold_us=3_000)}  # fmt: skip
    assert reports_watermark(lanes, None) == 2_999
    assert decision_time(lanes, None, 0, 100, final=False) == (2_999, 2_899)  # not settled
    lanes[1] = LaneReport(9_000, None, idle=True, quiet=True)  # applied: released
    assert decision_time(lanes, None, 0, 100, final=False) == (9_000, 9_000)
    a = ExhaustionAlerter(window_s=300, threshold=5, lateness_s=0, lanes=[0, 1])
    a.report(1, LaneReport(9_000, None, idle=True, quiet=True, hold_us=3_000))
    assert ExhaustionAlerter.from_bytes(a.to_bytes()).lanes[1].hold_us == 3_000
