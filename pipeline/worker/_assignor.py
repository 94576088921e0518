"""The group's assignor: co-partitioned slots as units, each kept by its owner.

A slot (partition ``p`` of the input, channel-operation and repartition topics) must go to
one process, which the range assignor gives too; but the range assignor lays every
partition out again on each change of membership, so a worker joining or leaving moves
nearly every slot, and each moved slot is restored from its state partition by its next
owner (seconds per slot under load; a chaos soak saw one partition make no progress for
119 s through a run of such rebalances). ``SlotAssignor`` moves only what must move:

- the topics a member subscribes to are grouped by partition count, and partition ``p``
  of every topic of one group is one *unit*, given to one member whole;
- each member reports, in its join metadata, the units it holds and the *assignment
  epoch* it got them in (the leader's count of assignments, carried from one to the next
  in the members' reports: aiokafka does not hand the group generation to assignors);
- a unit stays with the member that reports it with the newest epoch, up to that member's
  fair share (``n // members``, one more for the first ``n % members`` by units kept, then
  member id); what is left goes to members below their share. A zombie that wakes with an
  old epoch therefore claims nothing its successors hold;
- a member over its share keeps the units it got most recently (each unit's epoch of
  arrival is carried in the reports too) and hands over those it has held longest: a
  unit that has just moved has just stood still for a restore, and moving it again would
  add a second wait to the same partitions (a 10-minute soak saw one slot move three
  times in 35 s: a worker killed and restarted, paused, then woken), where handing over a
  settled unit starts a short wait somewhere else;
- when members subscribe to different topics (a rolling change of topics) the range
  layout is used for that assignment, as before.

``assign_units`` is the pure rule; ``SlotAssignor`` is its aiokafka adapter, through the
public ``AbstractPartitionAssignor`` interface. The consumer offers it alone (``range``
beside it made aiokafka send two JoinGroups per join, and the group rebalance in a loop:
``_consumer``), so a worker from before this assignor (``range`` only) and a current one
have no protocol in common: the broker refuses the newer one's join
(``INCONSISTENT_GROUP_PROTOCOL``) until the older ones have stopped.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

__all__ = ["Claim", "SlotAssignor", "Unit", "assign_units", "valid_holders"]

log = logging.getLogger("prism.worker")

Unit = tuple[int, int]
"""(partition count of the unit's topics, partition number)."""

FORMAT = 1  # of the join metadata and assignment user data


@dataclass(frozen=True, slots=True)
class Claim:
    """What a member reports holding: its units, the epoch of the assignment that gave
    them, and the epoch each unit arrived at this member in (``since``; a unit without
    one arrived at ``epoch``)."""

    epoch: int = 0
    units: frozenset[Unit] = frozenset()
    since: frozenset[tuple[Unit, int]] = frozenset()

    def arrived(self) -> dict[Unit, int]:
        got = dict(self.since)
        return {u: got.get(u, self.epoch) for u in self.units}


def valid_holders(claims: Mapping[str, Claim]) -> dict[Unit, str]:
    """Each claimed unit's valid holder: the member claiming it with the newest epoch (ties:
    the smaller member id). A zombie's older claim loses to its successor's."""
    holder: dict[Unit, str] = {}
    for m in sorted(claims):  # sorted: on equal epochs the smaller id is seen first and kept
        c = claims[m]
        for u in c.units:
            held = holder.get(u)
            if held is None or c.epoch > claims[held].epoch:
                holder[u] = m
    return holder


def assign_units(counts: Iterable[int], claims: Mapping[str, Claim]) -> dict[str, set[Unit]]:
    """Every unit of each partition count in ``counts`` to one member of ``claims``.

    Balanced per partition count (shares differ by at most one); a unit stays with the
    member claiming it with the newest epoch (ties: the smaller member id) unless that
    member holds more than its share, when it keeps the units that arrived most recently
    (ties: the smaller partition). Deterministic in its arguments."""
    members = sorted(claims)
    out: dict[str, set[Unit]] = {m: set() for m in members}
    if not members:
        return out
    holders = valid_holders(claims)
    for n in sorted(set(counts)):
        kept: dict[str, list[int]] = {m: [] for m in members}
        for (count, p), m in holders.items():
            if count == n and 0 <= p < n:
                kept[m].append(p)
        base, extra = divmod(n, len(members))
        order = sorted(members, key=lambda m: (-len(kept[m]), m))
        share = {m: base + (1 if i < extra else 0) for i, m in enumerate(order)}
        taken: set[int] = set()
        for m in members:
            arrived = claims[m].arrived()
            newest = sorted(kept[m], key=lambda p: (-arrived.get((n, p), 0), p))
            for p in newest[: share[m]]:
                out[m].add((n, p))
                taken.add(p)
        free = iter(p for p in range(n) if p not in taken)
        for m in order:
            while sum(1 for u in out[m] if u[0] == n) < share[m]:
                out[m].add((n, next(free)))
    return out


def _claim(user_data: bytes) -> Claim:
    """A member's report; anything unreadable (a range member, a newer format) is no claim."""
    try:
        doc = json.loads(user_data) if user_data else {}
        if doc.get("v") != FORMAT:
            return Claim()
        units = frozenset((int(n), int(p)) for n, p in doc["units"])
        since = frozenset(((int(n), int(p)), int(e)) for n, p, e in doc.get("since", ()))
        return Claim(int(doc["epoch"]), units, since)
    except (ValueError, KeyError, TypeError, AttributeError):
        return Claim()


def _user_data(claim: Claim) -> bytes:
    units = sorted(claim.units)
    since = sorted([n, p, e] for (n, p), e in claim.since)
    return json.dumps({"v": FORMAT, "epoch": claim.epoch, "units": units, "since": since}).encode()


class SlotAssignor(AbstractPartitionAssignor):  # type: ignore[misc]
    """``assign_units`` as an aiokafka assignor. One instance per consumer: it remembers
    the units its member holds, to report them at the next join."""

    name = "prism-slots"
    version = 0

    def __init__(self) -> None:
        self.held = Claim()

    def metadata(self, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:  # type: ignore[override]
        return ConsumerProtocolMemberMetadata(self.version, sorted(topics), _user_data(self.held))

    def on_assignment(self, assignment: ConsumerProtocolMemberAssignment) -> None:  # type: ignore[override]
        self.held = _claim(assignment.user_data)

    def assign(  # type: ignore[override]
        self, cluster: Any, members: Mapping[str, ConsumerProtocolMemberMetadata]
    ) -> dict[str, ConsumerProtocolMemberAssignment]:
        subscriptions = {frozenset(md.subscription) for md in members.values()}
        if len(subscriptions) != 1:
            log.warning(
                "members subscribe to different topics (%s): the range layout is used",
                sorted(sorted(s) for s in subscriptions),
            )
            return RangePartitionAssignor.assign(cluster, members)  # type: ignore[no-any-return]
        by_count: dict[int, list[str]] = {}
        for topic in sorted(next(iter(subscriptions))):
            partitions = cluster.partitions_for_topic(topic)
            if not partitions:
                log.warning("no partition metadata for topic %s", topic)
                continue
            by_count.setdefault(len(partitions), []).append(topic)
        claims = {m: _claim(md.user_data) for m, md in members.items()}
        epoch = max((c.epoch for c in claims.values()), default=0) + 1
        units = assign_units(by_count, claims)
        out: dict[str, ConsumerProtocolMemberAssignment] = {}
        holders = valid_holders(claims)
        for m, held in units.items():
            # a unit its valid holder keeps keeps its arrival; one that moved arrives now
            before = {u: e for u, e in claims[m].arrived().items() if holders.get(u) == m}
            since = frozenset((u, before.get(u, epoch)) for u in held)
            layout = [
                (topic, sorted(p for n, p in held if n == count))
                for count, topics in sorted(by_count.items())
                for topic in topics
            ]
            out[m] = ConsumerProtocolMemberAssignment(
                self.version,
                [(t, ps) for t, ps in layout if ps],
                _user_data(Claim(epoch, frozenset(held), since)),
            )
        return out
