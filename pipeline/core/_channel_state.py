"""Per-operation state of the channel semantics, the verdict on its records, and its rows.

Like a run, an operation keeps every distinct record it has seen as a compact fact, and
which records count is never stored: ``judge`` derives it from the set of facts each time
the operation changes (schemas/CONTRACT.md, "Channel operations"):

1. **One record per seq**: of the records claiming a ``seq``, the one with the smallest
   ``eventId`` holds it; the others are ``duplicate_seq`` (a function of the set, not of
   arrival order).
2. **Only legal transitions**: the holders are applied in ``seq`` order from "no state"
   (``schemas.CHANNEL_TRANSITIONS``); one that is not a legal successor of the state
   reached so far is ``illegal_transition`` and changes nothing. A transition delivered
   before its predecessor is thus quarantined until the predecessor arrives, then
   re-stated as accepted (its quarantine row retracted).

A denied admission without an operation id stands alone: its state is keyed by its event
id (``DENIAL_PREFIX``) and writes a denial row, no operation row.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from prism.schemas import (
    ChannelDenialRow,
    ChannelOperation,
    ChannelOperationRow,
    ChannelQuarantineRow,
    event_to_wire,
    is_legal_channel_transition,
)

from ._run import from_us
from ._stateformat import STATE_FORMAT, check_format
from ._types import OutRecord

__all__ = [
    "DENIAL_PREFIX",
    "DUPLICATE_SEQ",
    "ILLEGAL_TRANSITION",
    "OperationState",
    "Verdict",
    "denial_row",
    "judge",
    "operation_row",
    "quarantine_record",
    "quarantine_row",
]

ILLEGAL_TRANSITION = "illegal_transition"
DUPLICATE_SEQ = "duplicate_seq"
DENIAL_PREFIX = "~"  # state key of a denial without an operation id: "~" + its event id
_Fact = dict[str, Any]


def fact_of(op: ChannelOperation, ts_us: int, source: tuple[str, int, int, int]) -> _Fact:
    """The compact, serialisable record of one channel record: its wire form and position."""
    return {"s": op.seq, "ts": ts_us, "w": event_to_wire(op), "src": list(source)}


@dataclass(slots=True)
class Verdict:
    """Which of an operation's records count, and the state they lead to."""

    reasons: dict[str, str] = field(default_factory=dict)  # event id -> quarantine reason
    accepted: list[str] = field(default_factory=list)  # event ids, in seq order
    state: str | None = None


def judge(facts: dict[str, _Fact]) -> Verdict:
    """The verdict on an operation's facts (event id -> fact); see the module docstring."""
    out = Verdict()
    last_seq: int | None = None
    for seq, eid in sorted((f["s"], eid) for eid, f in facts.items()):
        if seq == last_seq:
            out.reasons[eid] = DUPLICATE_SEQ
            continue
        last_seq = seq
        state = facts[eid]["w"]["state"]
        if not is_legal_channel_transition(out.state, state):
            out.reasons[eid] = ILLEGAL_TRANSITION
            continue
        out.state = state
        out.accepted.append(eid)
    return out


@dataclass(slots=True)
class OperationState:
    """Everything the core remembers about one operation (or one standalone denial)."""

    key: str  # the operation id, or DENIAL_PREFIX + event id
    facts: dict[str, _Fact] = field(default_factory=dict)
    emitted: dict[str, str] = field(default_factory=dict)  # event id -> reason last written
    arrivals: int = 0  # distinct records seen
    stuck: bool = False
    last_us: int = 0  # latest record time (retention)

    @property
    def standalone(self) -> bool:
        return self.key.startswith(DENIAL_PREFIX)

    @property
    def version(self) -> int:
        """Grows with every distinct record, then with the stuck mark: never with batching."""
        return self.arrivals * 2 + (1 if self.stuck else 0)

    def knows(self, event_id: str) -> bool:
        return event_id in self.facts

    def copy(self) -> OperationState:
        """An independent copy, cheap: facts are never changed once made."""
        return replace(self, facts=dict(self.facts), emitted=dict(self.emitted))

    def to_bytes(self) -> bytes:
        return orjson.dumps(
            {
                "v": STATE_FORMAT,
                "k": self.key,
                "f": self.facts,
                "em": self.emitted,
                "n": self.arrivals,
                "st": self.stuck,
                "lu": self.last_us,
            }
        )

    @classmethod
    def from_bytes(cls, raw: bytes) -> OperationState:
        d = orjson.loads(raw)
        check_format(d, f"channel operation {d.get('k')}")
        return cls(d["k"], d["f"], d["em"], d["n"], d["st"], d["lu"])


def _first(facts: dict[str, _Fact], ids: list[str], name: str) -> Any:
    return next((facts[e]["w"][name] for e in ids if facts[e]["w"].get(name) is not None), None)


def operation_row(
    op: OperationState, verdict: Verdict, version: int | None = None
) -> ChannelOperationRow:
    """The operation's latest-state row (``version``: the row's, default the operation's)."""
    facts = op.facts
    ids = verdict.accepted or [min(facts, key=lambda e: (facts[e]["s"], e))]
    first = facts[ids[0]]["w"]
    last = facts[ids[-1]]
    times = [facts[e]["ts"] for e in ids]
    agent = _first(facts, ids, "agent")
    by_state = {facts[e]["w"]["state"]: facts[e]["ts"] for e in verdict.accepted}
    admitted, delivered = by_state.get("admitted"), by_state.get("delivered")
    return ChannelOperationRow(
        operation_id=op.key,
        connection_id=first["connectionId"],
        tenant_id=_first(facts, ids, "tenantId") if verdict.accepted else None,
        kind=first["kind"],
        state=verdict.state,
        reason=last["w"].get("reason") if verdict.accepted else None,
        run_id=_first(facts, ids, "runId") if verdict.accepted else None,
        session_id=_first(facts, ids, "sessionId") if verdict.accepted else None,
        agent_id=agent.get("id") if isinstance(agent, dict) and verdict.accepted else None,
        first_ts=from_us(min(times)),
        last_ts=from_us(max(times)),
        since=from_us(last["ts"]),
        admitted_at=None if admitted is None else from_us(admitted),
        delivered_at=None if delivered is None else from_us(delivered),
        stuck=op.stuck,
        transitions=len(verdict.accepted),
        version=op.version if version is None else version,
    )


def denial_row(eid: str, fact: _Fact, version: int, retracted: bool) -> ChannelDenialRow:
    w = fact["w"]
    return ChannelDenialRow(
        event_id=eid,
        operation_id=w.get("operationId"),
        ts=from_us(fact["ts"]),
        connection_id=w["connectionId"],
        tenant_id=w.get("tenantId"),
        kind=w["kind"],
        reason=w.get("reason") or "",
        version=version,
        retracted=retracted,
    )


def quarantine_row(
    eid: str, fact: _Fact, reason: str, version: int, retracted: bool
) -> ChannelQuarantineRow:
    w = fact["w"]
    source, partition, offset, received_us = fact["src"]
    return ChannelQuarantineRow(
        event_id=eid,
        operation_id=w["operationId"],
        seq=fact["s"],
        state=w["state"],
        ts=from_us(fact["ts"]),
        connection_id=w["connectionId"],
        tenant_id=w.get("tenantId"),
        reason=reason,
        payload=orjson.dumps(w).decode(),
        source=source,
        partition=partition,
        offset=offset,
        received_at=from_us(received_us),
        version=version,
        retracted=retracted,
    )


def quarantine_record(fact: _Fact, reason: str) -> OutRecord:
    """The ``.quarantine`` topic record: the record, the reason and the source position."""
    w = fact["w"]
    source, partition, offset, _ = fact["src"]
    return OutRecord(
        key=str(w.get("operationId") or w["connectionId"]).encode(),
        value=orjson.dumps(w),
        headers=(
            ("reason", reason.encode()),
            ("source-topic", source.encode()),
            ("source-partition", str(partition).encode()),
            ("source-offset", str(offset).encode()),
        ),
    )
