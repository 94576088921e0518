"""The group's assignor: slots whole, balanced, kept by their owners through changes of
membership, and handed to a joining member only once it has read them ahead
(``pipeline/worker/_assignor.py``)."""

from __future__ import annotations

from collections import Counter

from aiokafka.coordinator.protocol import (
    ConsumerProtocol,
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.worker._assignor import (
    Claim,
    SlotAssignor,
    Unit,
    assign_units,
    defer_cold,
    valid_holders,
)
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

    def warmups(self, m: str) -> set[int]:
        return {p for n, p in self.members[m].held.warmup if n == 12}

    def warm_up(self) -> dict[str, set[int]]:
        """What a worker does with its warm-ups: read them ahead, report them warm and
        rejoin (``_standby``). The slots each member was asked to warm up."""
        asked = {m: self.warmups(m) for m in self.members if self.members[m].held.warmup}
        for m in asked:
            self.members[m].warm = self.members[m].held.warmup
        self.rebalance()
        return asked


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
    g.members["m0"] = SlotAssignor()  # a new worker: a new member id, sorted first
    g.rebalance()
    assert g.moved(before) == 0 and g.held["m0"] == set()  # cold: it reads ahead first
    assert len(g.warmups("m0")) == 4
    asked = g.warm_up()
    assert sorted(len(s) for s in g.held.values()) == [4, 4, 4]
    assert g.moved(before) == 4  # the newcomer's share, and nothing else
    assert g.held["m0"] == asked["m0"]  # the very slots it read ahead
    assert g.members["m0"].held.warmup == frozenset()
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
    assert g.held["z"] == set() and g.held["a"] | g.held["b"] == set(range(12))  # cold
    g.warm_up()
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
    assert g.held["c"] == set()  # cold: it reads ahead first
    g.warm_up()
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


def test_a_cold_member_gets_at_once_the_slots_nobody_holds() -> None:
    """A worker killed and replaced by a new one: its slots have no holder to wait for."""
    g = Group()
    for m in ("a", "b", "c"):
        g.members[m] = SlotAssignor()
    g.rebalance()
    before = {m: set(s) for m, s in g.held.items()}
    del g.members["c"]
    g.members["d"] = SlotAssignor()  # joins in the same rebalance as c's eviction
    g.rebalance()
    assert g.held["d"] == before["c"] and g.warmups("d") == set()
    assert all(g.held[m] == before[m] for m in ("a", "b"))


def test_a_warm_member_is_handed_the_slots_it_warmed_as_far_as_balance_allows() -> None:
    g = Group()
    for m in ("a", "b"):
        g.members[m] = SlotAssignor()
    g.rebalance()  # a: 0-5, b: 6-11
    g.members["c"] = SlotAssignor()
    g.rebalance()
    g.members["c"].warm = frozenset({(12, 0), (12, 1), (12, 6), (12, 11)})  # not its asks
    g.rebalance()
    assert g.held["c"] == {0, 1, 6, 11}  # two from each, the ones it warmed
    assert sorted(len(s) for s in g.held.values()) == [4, 4, 4]
    # three warmed of one member's: balance has it hand over two, so two of them move
    g = Group()
    for m in ("a", "b"):
        g.members[m] = SlotAssignor()
    g.rebalance()
    g.members["c"] = SlotAssignor()
    g.members["c"].warm = frozenset({(12, 0), (12, 1), (12, 2)})
    g.rebalance()
    assert len(g.held["c"] & {0, 1, 2}) == 2 and len(g.held["c"]) == 4


def test_a_member_reporting_warm_units_is_not_cold() -> None:
    claims = {
        "a": Claim(3, frozenset((12, p) for p in range(12))),
        "b": Claim(0, warm=frozenset({(12, 1)})),
    }
    units, warmups = defer_cold(assign_units([12], claims), claims)
    assert warmups == {} and (12, 1) in units["b"] and len(units["b"]) == 6


@st.composite
def warm_claim_st(draw: st.DrawFn) -> Claim:
    return Claim(
        draw(st.integers(0, 4)),
        draw(st.frozensets(st.tuples(st.sampled_from([1, 12]), st.integers(0, 11)))),
        warm=draw(st.frozensets(st.tuples(st.just(12), st.integers(0, 11)), max_size=4)),
    )


@settings(max_examples=300, deadline=None)
@given(claims=st.dictionaries(st.sampled_from([f"m{i}" for i in range(5)]), warm_claim_st(),
                              min_size=1))  # fmt: skip
def test_a_cold_member_is_handed_no_unit_another_member_holds_and_warms_it_instead(
    claims: dict[str, Claim],
) -> None:
    counts = [1, 12]
    target = assign_units(counts, claims)
    out, warmups = defer_cold(target, claims)
    given_units = Counter(u for units in out.values() for u in units)
    assert set(given_units) == {(n, p) for n in counts for p in range(n)}
    assert set(given_units.values()) == {1}  # still every unit once
    holders = valid_holders(claims)
    cold = {m for m, c in claims.items() if not c.warm and m not in holders.values()}
    if cold == set(claims):  # a group starting: nothing to wait for
        assert out == target and warmups == {}
        return
    for m in claims:
        if m not in cold:
            assert m not in warmups and target[m] <= out[m]
            continue
        mine = warmups.get(m, set())
        assert out[m] | mine == target[m] and not out[m] & mine
        assert all(holders.get(u) not in (None, m) for u in mine)  # held by another
        assert all(holders.get(u) is None for u in out[m])  # nobody held these
        assert all(u in out[holders[u]] for u in mine)  # its holder keeps it meanwhile
    # a member over its share hands over the units others warmed before any other
    for m in claims:
        if m in cold:
            continue
        for n in counts:
            valid = {u for u, h in holders.items() if h == m and u[0] == n}
            handed = valid - target[m]
            kept = valid & target[m]
            warmed_elsewhere = {
                u for u in valid if any(u in claims[o].warm for o in claims if o != m)
            }
            if handed - warmed_elsewhere:  # it handed over one nobody warmed: it kept none
                assert not kept & warmed_elsewhere
