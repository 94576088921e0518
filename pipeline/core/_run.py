"""Per-run state: every distinct event of the run (as compact facts) and what was emitted.

Which events are accepted and which quarantined is never stored: ``_classify`` derives it
from the set of facts each time the run changes, so the same set of events gives the same
ledger whatever the order, batching or partitioning they arrived in (rule 10). What the
run last wrote to the ledger is remembered per event (``emitted``) and per turn
(``turns``), so a later change re-states exactly the rows it affects, with a higher
version.

A closed run without gaps shrinks to a tombstone (once the grace period has passed): the
facts go, what recognises duplicates (hashes of every event id seen), the owner and the
terminal stay.

Why facts are plain dicts in wire vocabulary rather than the pydantic event models: they
are the persisted state (JSON in the changelogged table and in ``ingest_state``), read
back on every restart and rebalance, and the rules (``_classify``, ``_timeline``) read
schemas/CONTRACT.md's camelCase fields directly; the typed models stay at the boundary
(``Delivery.event`` is an ``AgentEvent``, or the ``FastEvent`` the fast parse path built
with the payload and envelope already in this form), where parsing validated them once.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

import orjson

from prism.schemas import AgentEvent, FastEvent

from ._stateformat import STATE_FORMAT, check_format

if TYPE_CHECKING:  # _classify imports this module
    from ._classify import Classified

__all__ = [
    "ENVELOPE_FIELDS",
    "RunState",
    "Tombstone",
    "envelope_values",
    "fact_of",
    "from_us",
    "id_hash",
    "iso_us",
    "to_us",
]

ENVELOPE_FIELDS = (
    "tenant_id",
    "account_id",
    "user_id",
    "session_id",
    "agent_id",
    "agent_definition_revision",
    "provider",
    "model",
    "parent_run_id",
    "delegation_id",
    "child_id",
    "bundle_digest",
)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_BODY = b',"b":'  # where a stored run's head ends and its body begins (``RunState.head``)


def to_us(ts: datetime) -> int:
    """Aware datetime -> integer microseconds since the epoch (exact)."""
    delta = ts - _EPOCH
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


# Final: the compiled core reads a module's other globals from its dict on every use
_DATETIMES: Final[dict[int, datetime]] = {}  # microseconds since the epoch -> its datetime
_DATETIMES_MAX: Final = 1 << 15
_DAYS: Final[dict[int, tuple[str, int, int, int]]] = {}  # days since the epoch -> its date
_DAYS_MAX: Final = 1 << 12
_TWO_DIGITS: Final[tuple[str, ...]] = tuple(f"{i:02d}" for i in range(60))  # "00" .. "59"


def _day(day: int) -> tuple[str, int, int, int]:
    """Day ``day`` since the epoch: ``("YYYY-MM-DDT", year, month, day of month)``, cached."""
    known = _DAYS.get(day)
    if known is None:
        if len(_DAYS) >= _DAYS_MAX:
            _DAYS.clear()
        d = (_EPOCH + timedelta(day)).date()
        known = _DAYS[day] = (d.isoformat() + "T", d.year, d.month, d.day)
    return known


def from_us(us: int) -> datetime:
    """Integer microseconds since the epoch -> aware UTC datetime (exact; ``to_us``'s inverse).

    Cached: an event's time is turned into a datetime for its raw row, its usage and turn
    rows and its run's timeline, and a batch's arrival time for each of its rows; a
    datetime is immutable, so the rows may share one. A bounded dict, emptied when full:
    ``functools.lru_cache`` called from the compiled core went through a Python-level call
    and kept its recency list on every hit. A miss builds the datetime from its fields
    (175 ns), not as the epoch plus a timedelta (380 ns: the timedelta normalises).
    """
    dt = _DATETIMES.get(us)
    if dt is None:
        if len(_DATETIMES) >= _DATETIMES_MAX:
            _DATETIMES.clear()
        # floor division and remainder, not divmod: the compiled core does these on
        # machine integers (divmod is a generic call); both floor, so before 1970 works
        second = us // 1_000_000
        _, year, month, mday = _day(second // 86_400)
        second %= 86_400
        dt = _DATETIMES[us] = datetime(
            year, month, mday, second // 3600, second // 60 % 60, second % 60, us % 1_000_000, UTC
        )
    return dt


def iso_us(us: int) -> str:
    """``from_us(us).isoformat()``, exactly, without making a datetime per call.

    A closed run's record lists every step's time: one string per event. The date comes
    from a small cache by day, the time of day from its fields; the fraction is left out
    when it is zero, as ``isoformat`` does. (A cache by second, with an f-string's
    ``06d``, took about 2 us a call on a fleet spread over days: the cache missed and the
    format went through ``str.format``; ``bench/README.md``.)
    """
    fraction = us % 1_000_000
    second = us // 1_000_000
    date = _day(second // 86_400)[0]
    second %= 86_400
    two = _TWO_DIGITS
    hh, mm, ss = two[second // 3600], two[second // 60 % 60], two[second % 60]
    if fraction:
        micro = str(1_000_000 + fraction)[1:]  # six digits, zeros kept
        return f"{date}{hh}:{mm}:{ss}.{micro}+00:00"
    return f"{date}{hh}:{mm}:{ss}+00:00"


_BLAKE2B_8: Final = hashlib.blake2b(digest_size=8)  # never updated: each hash copies it


def id_hash(event_id: str) -> int:
    """A stable 63-bit hash of an event id (tombstones keep these instead of the ids).

    BLAKE2b's 8-byte digest, from a copy of a hasher made once: constructing one with its
    keyword takes longer than copying it (about 440 ns a hash against 560 from Python;
    a closed run's tombstone hashes each of its ids)."""
    h = _BLAKE2B_8.copy()
    h.update(event_id.encode())
    return int.from_bytes(h.digest()) >> 1


def envelope_values(ev: AgentEvent) -> dict[str, Any]:
    """The ownership/model/lineage fields an event carries (absent ones left out)."""
    agent, model, parent = ev.agent, ev.model, ev.parent
    values = {
        "tenant_id": ev.tenant_id,
        "account_id": ev.account_id,
        "user_id": ev.user_id,
        "session_id": ev.session_id,
        "agent_id": agent.id if agent is not None else None,
        "agent_definition_revision": agent.definition_revision if agent is not None else None,
        "provider": model.provider if model is not None else None,
        "model": model.model if model is not None else None,
        "parent_run_id": parent.run_id if parent is not None else None,
        "delegation_id": parent.delegation_id if parent is not None else None,
        "child_id": parent.child_id if parent is not None else None,
        "bundle_digest": ev.bundle_digest,
    }
    return {k: v for k, v in values.items() if v is not None}


def fact_of(
    ev: AgentEvent | FastEvent,
    data: dict[str, Any],
    envelope: dict[str, Any],
    ts_us: int,
    source: tuple[str, int, int, int, str | None],
    arrival: int,
) -> dict[str, Any]:
    """The compact, serialisable record of one event: what rows and rules need of it.

    ``data`` is the payload in wire form (``data_of``), ``envelope`` its
    ``envelope_values``; ``source`` is (topic or file, partition, offset, received at in
    microseconds, traceparent); ``arrival`` numbers the run's distinct events as they were
    first seen.
    """
    return {
        "s": ev.seq,
        "n": arrival,
        "t": ev.type,
        "ts": ts_us,
        "d": data,
        "e": envelope,
        "src": list(source),
    }


@dataclass(slots=True)
class Tombstone:
    """What a closed, gap-free run keeps once its facts are gone."""

    terminal_seq: int
    ids: set[int]  # id_hash of every event id seen
    meta: dict[str, Any]  # the run's envelope values (tenant_id decides tenant_mismatch)

    def to_json(self) -> dict[str, Any]:
        return {"t": self.terminal_seq, "i": sorted(self.ids), "m": self.meta}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Tombstone:
        return cls(d["t"], set(d["i"]), d["m"])


@dataclass(slots=True)
class RunState:
    """Everything the core remembers about one run."""

    run_id: str
    facts: dict[str, dict[str, Any]] = field(default_factory=dict)  # event id -> fact
    # event id -> the (status, superseded, owner values) its rows were last written with
    emitted: dict[str, list[Any]] = field(default_factory=dict)
    # "kind|turn|attempt" -> [turn event id, usage event id, owner values, ts_us] last written
    turns: dict[str, list[Any]] = field(default_factory=dict)
    terminal: dict[str, Any] | None = None  # {seq, id, type, ts, arrived} of the current one
    incomplete: bool = False
    closed: bool = False
    closed_wm_us: int | None = None
    clock_skew: bool = False
    arrivals: int = 0  # distinct events seen, numbering each fact's arrival
    last_us: int | None = None  # latest event time among accepted events
    alerts: dict[str, str] = field(default_factory=dict)  # alert rule -> state emitted
    tombstone: Tombstone | None = None
    # (len(facts), the classification of those facts): facts only grow until they are
    # dropped, so their count names them; never persisted, and a copy starts without it
    classified: tuple[int, Classified] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    @property
    def version(self) -> int:
        """The version of the rows the run writes now: a function of what it has seen.

        It grows with every distinct event (rows change only when one arrives), then with
        the close and the stale mark, so it never depends on how the events were split into
        batches: a worker that takes over a partition and replays a batch the dead worker
        had written never writes a lower version than the rows already stored.
        """
        return self.arrivals * 4 + (2 if self.closed else 0) + (1 if self.incomplete else 0)

    def knows(self, event_id: str) -> bool:
        """Whether this event id was seen before (a re-delivery: it changes nothing)."""
        if self.tombstone is not None:
            return id_hash(event_id) in self.tombstone.ids
        return event_id in self.facts

    def shrink(self, meta: dict[str, Any]) -> None:
        """Forget facts; keep what recognises duplicates and post-terminal events."""
        self.tombstone = self._tombstone(meta)
        self.facts = {}
        self.emitted = {}
        self.turns = {}
        self.classified = None

    def shrunk(self, meta: dict[str, Any]) -> RunState:
        """A new state: this run as ``shrink(meta)`` would leave it; this one is unchanged.

        Built directly, not with ``dataclasses.replace`` (an interpreted function reading
        every field: about 27,000 instructions a closed run, compiled); a unit test keeps
        it equal to ``replace`` over every field."""
        return RunState(
            run_id=self.run_id,
            facts={},
            emitted={},
            turns={},
            terminal=self.terminal,
            incomplete=self.incomplete,
            closed=self.closed,
            closed_wm_us=self.closed_wm_us,
            clock_skew=self.clock_skew,
            arrivals=self.arrivals,
            last_us=self.last_us,
            alerts=dict(self.alerts),
            tombstone=self._tombstone(meta),
        )

    def _tombstone(self, meta: dict[str, Any]) -> Tombstone:
        assert self.terminal is not None
        return Tombstone(self.terminal["seq"], {id_hash(e) for e in self.facts}, dict(meta))

    def copy(self) -> RunState:
        """An independent copy, cheap: facts are never changed once made, only replaced."""
        tb = self.tombstone
        return replace(
            self,
            facts=dict(self.facts),
            emitted=dict(self.emitted),
            turns=dict(self.turns),
            alerts=dict(self.alerts),
            tombstone=None if tb is None else Tombstone(tb.terminal_seq, set(tb.ids), tb.meta),
        )

    # -- persistence ----------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        """The stored row: one JSON object whose last key, ``b``, holds the facts, the
        emitted rows and the turns (the bulk of it), so ``head`` can read the rest alone.
        The envelope the facts of a run almost always share is stored once: each fact
        names its envelope by its index in the body's last list."""
        envelopes: list[dict[str, Any]] = []  # each distinct one once: facts name it
        index: dict[int, int] = {}  # id of an envelope object -> its place in envelopes
        facts = {}
        for eid, fact in self.facts.items():
            e = fact["e"]
            i = index.get(id(e))
            if i is None:  # facts of one run share their envelope objects, mostly
                i = next((j for j, known in enumerate(envelopes) if known == e), len(envelopes))
                if i == len(envelopes):
                    envelopes.append(e)
                index[id(e)] = i
            facts[eid] = {**fact, "e": i}
        return orjson.dumps(
            {
                "v": STATE_FORMAT,
                "r": self.run_id,
                "t": self.terminal,
                "inc": self.incomplete,
                "c": self.closed,
                "cw": self.closed_wm_us,
                "sk": self.clock_skew,
                "n": self.arrivals,
                "lu": self.last_us,
                "a": self.alerts,
                "tb": None if self.tombstone is None else self.tombstone.to_json(),
                "b": [facts, self.emitted, self.turns, envelopes],
            }
        )

    @staticmethod
    def head(raw: bytes) -> dict[str, Any]:
        """A stored row's fields without its body (``b``): what restoring a lane indexes a
        run by, read in microseconds where the whole row takes a millisecond (its facts).

        ``b`` is the row's last key and every key before it is one of ours, so the first
        ``,"b":`` ends the head (a string's quote is escaped, so none can contain it). A
        row of the format before (facts under ``f``) is read whole.
        """
        end = raw.find(_BODY)
        d = orjson.loads(raw if end < 0 else raw[:end] + b"}")
        return check_format(d, f"run {d.get('r')}")

    @classmethod
    def from_bytes(cls, raw: bytes) -> RunState:
        d = orjson.loads(raw)
        check_format(d, f"run {d.get('r')}")
        body: list[Any] = d["b"] if "b" in d else [d["f"], d["em"], d["tu"]]
        facts, emitted, turns = body[:3]
        if len(body) > 3:  # format 3: envelopes stored once, shared again once read
            envelopes = body[3]
            for fact in facts.values():
                fact["e"] = envelopes[fact["e"]]
        return cls(
            run_id=d["r"],
            facts=facts,
            emitted=emitted,
            turns=turns,
            terminal=d["t"],
            incomplete=d["inc"],
            closed=d["c"],
            closed_wm_us=d["cw"],
            clock_skew=d["sk"],
            arrivals=d["n"],
            last_us=d["lu"],
            alerts=d["a"],
            tombstone=None if d["tb"] is None else Tombstone.from_json(d["tb"]),
        )
