"""The group's assignor: slots whole, balanced, and kept by their owners through changes
of membership (``pipeline/worker/_assignor.py``)."""

from __future__ import annotations

from collections import Counter

from aiokafka.coordinator.protocol import (
    ConsumerProtocol,
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.worker._assignor import Claim, SlotAssignor, Unit, assign_units
from pipeline.worker._consumer import check_copartitioned

SLOT_TOPICS = ["in", "in.repartition", "ops", "ops.repartition"]
TOPICS = {**{t: 12 for t in SLOT_TOPICS}, "deaths": 1}


class Cluster:
    """The one call an assignor makes of aiokafka's cluster metadata."""

    def __init__(self, topics: dict[str, int]) -> None:
        self.topics = topics

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        n = self.topics.get(topic)
        return None if n is None else set(range(n))


class Group:
    """Members that each keep one ``SlotAssignor``, joined through encoded metadata as a
    broker relays it; the first member (sorted) leads, as any member may."""

    def __init__(self) -> None:
        self.members: dict[str, SlotAssignor] = {}
        self.held: dict[str, set[int]] = {}

    def rebalance(self, topics: dict[str, list[str]] | None = None) -> None:
        cluster = Cluster(TOPICS)
        metadata = {
            m: ConsumerProtocol.METADATA.decode(
                a.metadata((topics or {}).get(m, list(TOPICS))).encode()
            )
            for m, a in self.members.items()
        }
        leader = self.members[min(self.members)]
        out = leader.assign(cluster, metadata)
        assert set(out) == set(self.members)
        for m, assignment in out.items():
            wire = ConsumerProtocol.ASSIGNMENT.decode(assignment.encode())
            self.members[m].on_assignment(wire)
            tps = wire.partitions()
            self.held[m] = set(check_copartitioned(tps, SLOT_TOPICS))

    def moved(self, before: dict[str, set[int]]) -> int:
        return sum(len(self.held.get(m, set()) - before.get(m, set())) for m in self.held)


def test_a_slot_is_given_whole_and_the_single_partition_topic_to_one_member() -> None:
    g = Group()
    for m in ("a", "b", "c"):
        g.members[m] = SlotAssignor()
    g.rebalance()
    assert sorted(len(s) for s in g.held.values()) == [4, 4, 4]
    assert set().union(*g.held.values()) == set(range(12))
    deaths = [m for m, a in g.members.items() if (1, 0) in a.held.units]
    assert len(deaths) == 1


def test_a_member_leaving_or_joining_moves_only_the_slots_that_must_move() -> None:
    g = Group()
    for m in ("m1", "m2", "m3"):
        g.members[m] = SlotAssignor()
    g.rebalance()
    before = {m: set(s) for m, s in g.held.items()}
    gone = before.pop("m2")
    del g.members["m2"], g.held["m2"]
    g.rebalance()
    assert g.moved(before) == len(gone) == 4  # only the leaver's slots move
    for m in before:
        assert before[m] <= g.held[m]

    before = {m: set(s) for m, s in g.held.items()}
    g.members["m0"] = SlotAssignor()  # a restarted worker: a new member id, sorted first
    g.rebalance()
    assert sorted(len(s) for s in g.held.values()) == [4, 4, 4]
    assert g.moved(before) == 4  # the newcomer's share, and nothing else
    for m in before:
        assert g.held[m] <= before[m]


def test_a_zombie_waking_with_an_old_epoch_claims_nothing_its_successors_hold() -> None:
    g = Group()
    for m in ("a", "b", "z"):
        g.members[m] = SlotAssignor()
    g.rebalance()
    zombie = g.members.pop("z")
    zombie_slots = g.held.pop("z")
    g.rebalance()  # evicted: a and b take its slots
    taken_over = {m: set(s) for m, s in g.held.items()}
    g.members["z"] = zombie  # wakes, rejoins still reporting its old slots
    g.rebalance()
    assert g.held["z"] and len(g.held["z"]) == 4
    for m in ("a", "b"):
        assert g.held[m] <= taken_over[m]
    # each of a, b hands back two slots: the zombie's old claim counts for nothing
    assert zombie.held.epoch > 2
    assert sum(len(taken_over[m] - g.held[m]) for m in ("a", "b")) == 4
    assert zombie_slots  # it had slots before


def test_members_subscribing_to_different_topics_get_the_range_layout() -> None:
    g = Group()
    for m in ("a", "b"):
        g.members[m] = SlotAssignor()
    g.rebalance({"a": list(TOPICS), "b": SLOT_TOPICS})
    assert g.held == {"a": set(range(6)), "b": set(range(6, 12))}


def test_a_member_over_its_share_hands_over_the_slots_it_has_held_longest() -> None:
    g = Group()
    for m in ("a", "b", "c"):
        g.members[m] = SlotAssignor()
    g.rebalance()
    settled = {m: set(s) for m, s in g.held.items()}
    gone = g.members.pop("c")
    g.held.pop("c")
    g.rebalance()  # c's slots arrive at a and b
    arrived = {m: g.held[m] - settled[m] for m in ("a", "b")}
    assert all(len(arrived[m]) == 2 for m in ("a", "b"))
    g.members["c"] = gone  # back (its old claim is stale): a and b are over their share
    g.rebalance()
    for m in ("a", "b"):  # the slots that just moved stay; two settled ones go to c
        assert arrived[m] <= g.held[m]
        assert len(settled[m] - g.held[m]) == 2
    assert g.held["c"] == (settled["a"] | settled["b"]) - g.held["a"] - g.held["b"]
    # the wire format carries each slot's arrival
    assert {u for u, _ in g.members["a"].held.since} == g.members["a"].held.units


def test_a_report_it_cannot_read_is_no_claim() -> None:
    a = SlotAssignor()
    for junk in (b"", b"not json", b'{"v": 99, "epoch": 3, "units": [[12, 1]]}', b"[1, 2]"):
        a.on_assignment(ConsumerProtocolMemberAssignment(0, [], junk))
        assert a.held == Claim()
    md = a.metadata(["in"])
    assert isinstance(md, ConsumerProtocolMemberMetadata)


@st.composite
def claim_st(draw: st.DrawFn) -> Claim:
    """A report: units (some out of range), the epoch, and an arrival for some units."""
    epoch = draw(st.integers(0, 4))
    units = draw(st.frozensets(st.tuples(st.sampled_from([1, 5, 12, 13]), st.integers(-1, 13))))
    arrivals = draw(st.lists(st.integers(0, epoch), min_size=len(units), max_size=len(units)))
    known = draw(st.lists(st.booleans(), min_size=len(units), max_size=len(units)))
    since = frozenset((u, e) for u, e, k in zip(sorted(units), arrivals, known, strict=True) if k)
    return Claim(epoch, units, since)


claims_st = st.dictionaries(st.sampled_from([f"m{i}" for i in range(7)]), claim_st(), min_size=1)


@settings(max_examples=300, deadline=None)
@given(counts=st.sets(st.sampled_from([1, 5, 12]), min_size=1), claims=claims_st)
def test_every_unit_goes_to_one_member_balanced_and_valid_claims_are_kept(
    counts: set[int], claims: dict[str, Claim]
) -> None:
    out = assign_units(counts, claims)
    assert set(out) == set(claims)
    assert out == assign_units(sorted(counts, reverse=True), dict(reversed(claims.items())))
    given_units = Counter(u for units in out.values() for u in units)
    assert set(given_units) == {(n, p) for n in counts for p in range(n)}
    assert set(given_units.values()) == {1}
    for n in counts:
        shares = [sum(1 for u in units if u[0] == n) for units in out.values()]
        assert max(shares) - min(shares) <= 1
        # the valid claim of a unit: the newest epoch, then the smaller member id
        valid: dict[str, set[Unit]] = {m: set() for m in claims}
        for p in range(n):
            claimants = [m for m, c in claims.items() if (n, p) in c.units]
            if claimants:
                best = min(claimants, key=lambda m: (-claims[m].epoch, m))
                valid[best].add((n, p))
        for m, units in out.items():
            mine = {u for u in units if u[0] == n}
            assert len(mine & valid[m]) == min(len(valid[m]), len(mine))
            # over its share, a member keeps the units that arrived at it most recently
            arrived = claims[m].arrived()
            order = {u: (-arrived[u], u[1]) for u in valid[m]}
            kept, handed = mine & valid[m], valid[m] - mine
            assert all(order[k] < order[h] for k in kept for h in handed)
