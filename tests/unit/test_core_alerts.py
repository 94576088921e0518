"""The run-limit exhaustion alerter: sliding event-time window, one alert per key per window."""

from __future__ import annotations

from datetime import timedelta

from prism.pipeline.core import ExhaustionAlerter, LimitDeath
from prism.pipeline.core._run import to_us
from tests.fixtures.runs import T0


def deaths(n, *, axis="maxTurns", tenant="acme", start=T0, step_s=10, prefix="r"):
    return [
        LimitDeath(tenant, axis, f"{prefix}{i}", start + timedelta(seconds=step_s * i))
        for i in range(n)
    ]


def test_fires_once_when_the_window_count_reaches_the_threshold_then_resolves():
    a = ExhaustionAlerter(window_s=300, threshold=3)
    rows = a.observe(deaths(5))
    assert [(r.state, r.key, r.value) for r in rows] == [("firing", "maxTurns", 3.0)]
    assert a.advance(to_us(T0 + timedelta(seconds=100))) == []  # still 5 in the window
    resolved = a.advance(to_us(T0 + timedelta(seconds=340)))  # deaths at 0..40 s left the window
    assert [(r.state, r.alert_id) for r in resolved] == [("resolved", rows[0].alert_id)]
    assert resolved[0].version == 2


def test_keys_are_per_tenant_and_axis_and_duplicates_do_not_count():
    a = ExhaustionAlerter(window_s=300, threshold=3)
    d = deaths(2) + deaths(2, axis="maxCost") + deaths(2, tenant="other")
    assert a.observe(d + d) == []  # two per key, re-delivered: never three
    fired = a.observe(deaths(1, prefix="x", start=T0 + timedelta(seconds=30)))
    assert [(r.tenant_id, r.key) for r in fired] == [("acme", "maxTurns")]


def test_deaths_spread_wider_than_the_window_never_fire():
    a = ExhaustionAlerter(window_s=60, threshold=3)
    assert a.observe(deaths(10, step_s=40)) == []


def test_state_round_trips():
    a = ExhaustionAlerter(window_s=300, threshold=3)
    a.observe(deaths(4))
    b = ExhaustionAlerter.from_bytes(a.to_bytes())
    assert b.to_bytes() == a.to_bytes()
    assert [r.state for r in b.advance(to_us(T0 + timedelta(hours=1)))] == ["resolved"]
