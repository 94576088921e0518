"""A soak's longest stall names who held the partition meanwhile, and when each fault hit.

A short chaos soak failed once on its stall bound alone (45.7 s against 45 s) with the
ledger exact, and its report could not say why: the partition's slot had moved between
processes the faults killed, but the verdict named neither the holders nor the faults'
times. The watch now notes each partition's holder in every stable assignment it sees
(a restarted worker, with its new pid, is another holder), and the verdict gives the
stalled partition's holders over the stall and each fault's time into the load.
"""

from __future__ import annotations

from typing import Any

from prism.devstack._chaos import Fault, GroupWatch
from prism.devstack.soak import _group_figures, render_verdict

TP_A = ("soak.agent-events", 5)
TP_B = ("soak.agent-events", 6)


def _watch() -> GroupWatch:
    return GroupWatch("127.0.0.1:1", "g", {"soak.agent-events": 12}, set(), pool=None)  # type: ignore[arg-type]


def _see(
    w: GroupWatch, now: float, state: str, members: dict[str, tuple[str, int, set[Any]]]
) -> None:
    """One poll: ``members`` is member id -> (worker, pid, its partitions)."""
    w.state = state
    w.owners = {m: (name, pid) for m, (name, pid, _) in members.items()}
    w._note_holders({m: ("client", frozenset(tps)) for m, (_, _, tps) in members.items()}, now)


def test_holders_change_only_in_stable_assignments_and_name_each_incarnation() -> None:
    w = _watch()
    _see(w, 10.0, "Stable", {"m3": ("w3", 103, {TP_A}), "m1": ("w1", 101, {TP_B})})
    _see(w, 11.0, "Stable", {"m3": ("w3", 103, {TP_A}), "m1": ("w1", 101, {TP_B})})  # no change
    _see(w, 15.0, "PreparingRebalance", {"m1": ("w1", 101, set())})  # mid-rebalance: not noted
    _see(w, 17.0, "Stable", {"m1": ("w1", 101, {TP_A, TP_B})})
    _see(w, 30.0, "Stable", {"m2": ("w2", 102, {TP_B})})  # TP_A held by nobody
    _see(w, 36.0, "Stable", {"m1b": ("w1", 201, {TP_A}), "m2": ("w2", 102, {TP_B})})
    assert w.holders[TP_A] == [
        (10.0, "w3 (pid 103)"),
        (17.0, "w1 (pid 101)"),
        (30.0, "nobody"),
        (36.0, "w1 (pid 201)"),
    ]
    assert w.holders[TP_B] == [(10.0, "w1 (pid 101)"), (30.0, "w2 (pid 102)")]


def test_holders_between_starts_with_the_holder_at_the_start() -> None:
    w = _watch()
    for t, who in [
        (0.0, "w3 (pid 1)"),
        (17.0, "w1 (pid 2)"),
        (36.0, "w1 (pid 3)"),
        (60.0, "w2 (pid 4)"),
    ]:
        w.holders.setdefault(TP_A, []).append((t, who))
    assert w.holders_between(TP_A, 1.6, 47.3) == [
        (0.0, "w3 (pid 1)"),
        (17.0, "w1 (pid 2)"),
        (36.0, "w1 (pid 3)"),
    ]
    assert w.holders_between(TP_A, 17.0, 20.0) == [(17.0, "w1 (pid 2)")]
    assert w.holders_between(TP_B, 0.0, 99.0) == []


def test_the_verdict_names_the_stalled_partitions_holders_and_the_faults_times() -> None:
    w = _watch()
    t0 = 1000.0
    w.holders[TP_A] = [
        (t0 - 5.0, "w3 (pid 1)"),
        (t0 + 16.2, "w1 (pid 2)"),
        (t0 + 35.0, "w1 (pid 3)"),
    ]
    w.holders[TP_B] = [(t0 - 5.0, "w2 (pid 9)")]
    w.longest_stall = (45.7, TP_A, t0 + 1.6)
    w.faults = [
        Fault("worker SIGKILL", t0 + 9.1, [], recovered_s=41.3),
        Fault("limit-deaths holder SIGKILL", t0 + 28.0, [], recovered_s=19.0),
    ]
    figures = _group_figures(w, t0)
    assert figures["longest_stall_holders"] == [
        [-5.0, "w3 (pid 1)"],
        [16.2, "w1 (pid 2)"],
        [35.0, "w1 (pid 3)"],
    ]
    assert [r["at_s"] for r in figures["recoveries"]] == [9.1, 28.0]
    text = render_verdict(_verdict(figures))
    assert (
        "held meanwhile by w3 (pid 1) from -5.0s, then w1 (pid 2) from 16.2s, "
        "then w1 (pid 3) from 35.0s" in text
    )
    assert "recovery after 2 faults (at 9.1s, 28.0s into the load): p50 30.1s, max 41.3s" in text


def test_a_stall_without_a_stable_assignment_seen_says_so() -> None:
    w = _watch()
    w.longest_stall = (12.0, TP_A, 5.0)
    figures = _group_figures(w, 0.0)
    assert figures["longest_stall_holders"] == []
    assert "held meanwhile by (not seen: no stable assignment" in render_verdict(_verdict(figures))


def _verdict(figures: dict[str, Any]) -> dict[str, Any]:
    """A whole verdict around ``figures``, as ``render_verdict`` reads one."""
    return {
        "published": 44_378, "offered_rate": 990.0, "target_rate": 1000.0, "minutes": 0.75,
        "load_s": 45.0, "seed": 2, "foreign_keys": {}, "checks": [], "lost": 0, "doubled": 0,
        "unexpected": 0, "offsets_accounted": True, "partitions_read": 49, "end_offsets": {},
        "published_per_topic": {}, "min_rebalances_kept": 1, "actions": [], "workers": {},
        "worker_exits": [], "exit_codes": {}, "drain_s": 20.0, "failures": [], "ok": True,
        **figures,
    }  # fmt: skip
