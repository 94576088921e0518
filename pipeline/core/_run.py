"""Per-run state: the run's applied events (as compact facts) plus what dedup needs.

A run's derived record (status, turns, cache hit rate, exhaustion, gaps...) is never
stored: ``_timeline`` recomputes it from the facts, so the same set of events gives the
same record whatever the order or batching they arrived in. Closed runs without gaps
shrink to a tombstone (terminal seq + seen seqs above it) that still recognises
duplicates and post-terminal events.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

__all__ = ["ENVELOPE_FIELDS", "RunState", "from_us", "to_us"]

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


def to_us(ts: datetime) -> int:
    """Aware datetime -> integer microseconds since the epoch (exact)."""
    delta = ts - _EPOCH
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_us(us: int) -> datetime:
    return datetime.fromtimestamp(us // 1_000_000, tz=UTC).replace(microsecond=us % 1_000_000)


def envelope_values(ev: Any) -> dict[str, Any]:
    """The ownership/model/lineage fields an event carries (None when absent)."""
    agent, model, parent = ev.agent, ev.model, ev.parent
    return {
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


@dataclass(slots=True)
class RunState:
    """Everything the core remembers about one run."""

    run_id: str
    meta: dict[str, list[Any]] = field(default_factory=dict)  # field -> [seq, value]
    facts: dict[int, dict[str, Any]] = field(default_factory=dict)  # seq -> fact
    seen: set[int] = field(default_factory=set)  # seqs applied or quarantined
    ids: set[str] = field(default_factory=set)  # eventIds applied or quarantined
    terminal: dict[str, Any] | None = None  # {seq, type, id, ts_us, arrived}
    incomplete: bool = False
    closed: bool = False
    closed_wm_us: int | None = None
    tombstone: bool = False
    revision: int = 0
    first_us: int | None = None
    last_us: int | None = None
    alerts: dict[str, str] = field(default_factory=dict)  # alert rule -> state emitted

    # -- dedup ----------------------------------------------------------------------------
    def is_duplicate(self, event_id: str, seq: int) -> bool:
        if event_id in self.ids or seq in self.seen:
            return True
        # A tombstone forgot its seqs below the terminal: it only exists when all arrived.
        return self.tombstone and self.terminal is not None and seq <= self.terminal["seq"]

    def mark_seen(self, event_id: str, seq: int) -> None:
        self.seen.add(seq)
        if not self.tombstone:
            self.ids.add(event_id)

    # -- applying -------------------------------------------------------------------------
    def apply(self, ev: Any, data: dict[str, Any], ts_us: int) -> None:
        """Record an accepted event as a fact and fold its envelope fields into ``meta``."""
        self.facts[ev.seq] = {"t": ev.type, "ts": ts_us, "id": ev.event_id, "d": data}
        for name, value in envelope_values(ev).items():
            if value is None:
                continue
            known = self.meta.get(name)
            if known is None or ev.seq < known[0]:
                self.meta[name] = [ev.seq, value]
        if self.first_us is None or ts_us < self.first_us:
            self.first_us = ts_us
        if self.last_us is None or ts_us > self.last_us:
            self.last_us = ts_us
        self.revision += 1

    def meta_value(self, name: str) -> Any:
        known = self.meta.get(name)
        return None if known is None else known[1]

    def missing_seqs(self) -> list[int]:
        """Seqs below the terminal (or below the highest applied seq) never seen."""
        if self.tombstone:
            return []
        top = self.terminal["seq"] if self.terminal is not None else max(self.facts, default=0)
        return [s for s in range(top) if s not in self.seen]

    def shrink(self) -> None:
        """Forget facts and ids; keep what recognises duplicates and post-terminal events."""
        assert self.terminal is not None
        term = self.terminal["seq"]
        self.tombstone = True
        self.facts = {}
        self.ids = set()
        self.seen = {s for s in self.seen if s > term}

    # -- persistence ----------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        return orjson.dumps(
            {
                "r": self.run_id,
                "m": self.meta,
                "f": self.facts,
                "s": sorted(self.seen),
                "i": sorted(self.ids),
                "t": self.terminal,
                "inc": self.incomplete,
                "c": self.closed,
                "cw": self.closed_wm_us,
                "tb": self.tombstone,
                "v": self.revision,
                "fu": self.first_us,
                "lu": self.last_us,
                "a": self.alerts,
            },
            option=orjson.OPT_NON_STR_KEYS,
        )

    @classmethod
    def from_bytes(cls, raw: bytes) -> RunState:
        d = orjson.loads(raw)
        return cls(
            run_id=d["r"],
            meta=d["m"],
            facts={int(k): v for k, v in d["f"].items()},
            seen=set(d["s"]),
            ids=set(d["i"]),
            terminal=d["t"],
            incomplete=d["inc"],
            closed=d["c"],
            closed_wm_us=d["cw"],
            tombstone=d["tb"],
            revision=d["v"],
            first_us=d["fu"],
            last_us=d["lu"],
            alerts=d["a"],
        )
