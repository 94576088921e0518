"""The soak's drain fails a group that stops draining, not one that drains slowly.

A short soak on a machine running at a quarter of its speed drained 57,890 records at
about 390 records/s, steadily, and failed a fixed 150 s bound with 1,171 left: the
bound measured the machine. The drain now fails when neither the published topics' lag
nor the workers' own topics left behind reach a new low for ``stall`` seconds, and
allows a steadily draining group up to its (much longer) timeout.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pytest

from prism.devstack.soak import _drain

TP = tuple[str, int]


class _Pool:
    def revive(self) -> None:
        pass


@dataclass
class _Watch:
    """A group whose committed offsets follow ``commits(t)`` (seconds since the start)."""

    commits: object  # Callable[[float], int]
    end: int = 1_000
    plain: set[str] = field(default_factory=lambda: {"in"})
    targets: dict[TP, int] = field(default_factory=dict)
    reached: set[TP] = field(default_factory=set)
    own_at: int = 0  # the workers' own topic: committed offset
    started: float = field(default_factory=time.monotonic)

    @property
    def positions(self) -> dict[TP, tuple[int, int]]:
        done = min(self.end, self.commits(time.monotonic() - self.started))  # type: ignore[operator]
        pos = {("in", 0): (done, self.end), ("own", 0): (self.own_at, 5)}
        for tp, target in self.targets.items():
            if pos[tp][0] >= target:
                self.reached.add(tp)
        return pos

    def fresh(self, since: float) -> bool:
        return True

    def reach(self, targets: dict[TP, int]) -> None:
        self.reached, self.targets = set(), dict(targets)
        self.own_at = 5  # the workers commit their own topics at once


def test_a_slow_but_steady_drain_passes_the_stall_bound_many_times_over() -> None:
    # 1,000 records at 250/s: 4 s of draining against a 1 s stall bound
    watch = _Watch(commits=lambda t: int(250 * t))
    took = _drain(watch, _Pool(), timeout=30.0, settle=0.5, stall=1.0)  # type: ignore[arg-type]
    assert 4.0 <= took < 30.0
    assert watch.reached == {("own", 0)}


def test_a_group_that_stops_draining_fails_after_the_stall_bound_not_the_timeout() -> None:
    watch = _Watch(commits=lambda t: min(600, int(400 * t)))  # stuck at 600 of 1,000
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"stopped draining: no progress for \d+s \(lag 400,"):
        _drain(watch, _Pool(), timeout=60.0, settle=0.5, stall=2.0)  # type: ignore[arg-type]
    assert time.monotonic() - started < 10.0


def test_workers_topics_that_never_reach_their_ends_fail_after_the_stall_bound() -> None:
    watch = _Watch(commits=lambda t: 1_000)

    def stuck(targets: dict[TP, int]) -> None:  # the workers never commit their own topics
        watch.reached, watch.targets = set(), dict(targets)

    watch.reach = stuck  # type: ignore[method-assign]
    with pytest.raises(TimeoutError, match="1 partitions of the workers' topics behind"):
        _drain(watch, _Pool(), timeout=60.0, settle=0.5, stall=2.0)  # type: ignore[arg-type]


def test_the_timeout_still_bounds_a_drain_that_never_ends() -> None:
    watch = _Watch(commits=lambda t: int(100 * t), end=10**9)  # always progressing
    with pytest.raises(TimeoutError, match="did not drain within 3s"):
        _drain(watch, _Pool(), timeout=3.0, settle=0.5, stall=2.0)  # type: ignore[arg-type]
