"""Which of a run's events count: a function of the run's set of events (rule 10).

Over the distinct events of one run (an event id seen again is a re-delivery and not
here), in this order:

1. **One event per seq, one owner** (rules 1 and 11), walking the seqs upwards: of the
   events claiming a ``seq`` that agree with the owner, the first to arrive holds it,
   unless a claim with the same tenant field (a duplicate) has a smaller ``eventId``;
   the others are ``tenant_mismatch`` (they carry another tenant than the owner's) or
   ``duplicate_seq`` (the other claims "change nothing"). The owner is the tenant of the
   lowest holder carrying one; events omitting it inherit it (their rows are re-stated
   when it becomes known).
2. **One terminal** (rule 2): the holder with the lowest seq among terminal types. Holders
   above it are ``conflicting_terminal`` (terminal types) or ``post_terminal``.
3. **One usage per turn attempt** (rule 12): among reported ``provider_turn`` usage rows, in
   seq order, one whose ``(turn, attempt)`` or ``entryId`` an earlier row took is
   ``duplicate_usage``.

Everything else is accepted. Each step reads the set ordered by ``seq``, and between
duplicate claims of one seq (the same tenant field) by ``eventId``, never by arrival:
which of two duplicates counts must not depend on which partition, producer or batch
brought it first (rule 10), as with channel operations (``_channel_state``). A duplicate
that arrives after another took its seq and has the smaller id takes it over: the
other's rows are retracted and it is quarantined ``duplicate_seq`` instead. Arrival (a
fact's ``n``) decides only between claims that carry different tenants: rule 11 fixes a
run's owner by its first event, so a tenant reusing another's ``runId`` can neither take
over nor bill into that run once it exists, whatever ids it picks.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

from prism.schemas import TERMINAL_TYPES

from ._run import ENVELOPE_FIELDS

__all__ = ["MAX_GAP_RANGES", "QUARANTINE_REASONS", "Classified", "classify", "seq_gaps"]

TENANT_MISMATCH = "tenant_mismatch"
DUPLICATE_SEQ = "duplicate_seq"
POST_TERMINAL = "post_terminal"
CONFLICTING_TERMINAL = "conflicting_terminal"
DUPLICATE_USAGE = "duplicate_usage"
QUARANTINE_REASONS = (
    TENANT_MISMATCH,
    DUPLICATE_SEQ,
    POST_TERMINAL,
    CONFLICTING_TERMINAL,
    DUPLICATE_USAGE,
)
MAX_GAP_RANGES = 64  # gap lists are stored as at most this many ranges, plus a total count
# ``is_terminal_agent_event_type``'s set, read directly: compiled, a call into that Python
# function per event cost more than the test itself (Final: read without a dict lookup)
_TERMINAL: Final = TERMINAL_TYPES


@dataclass(slots=True)
class Classified:
    """The verdict on a run's events, and what follows from it."""

    reasons: dict[str, str] = field(default_factory=dict)  # event id -> quarantine reason
    accepted: list[tuple[int, str]] = field(default_factory=list)  # (seq, event id), by seq
    terminal: tuple[int, str] | None = None  # (seq, event id)
    meta: dict[str, Any] = field(default_factory=dict)  # the run's envelope values
    superseded: set[str] = field(default_factory=set)  # estimates a reported row outranks
    missing: list[tuple[int, int]] = field(default_factory=list)  # inclusive seq ranges
    missing_count: int = 0


def classify(facts: dict[str, dict[str, Any]]) -> Classified:
    """Classify a run's facts (event id -> fact); see the module docstring."""
    out = Classified()
    owner: str | None = None
    holders: dict[int, str] = {}
    for seq, _, eid in sorted((f["s"], f["n"], eid) for eid, f in facts.items()):
        tenant = facts[eid]["e"].get("tenant_id")
        if not (tenant is None or owner is None or tenant == owner):
            out.reasons[eid] = TENANT_MISMATCH
        elif seq not in holders:
            holders[seq] = eid
            if owner is None:
                owner = tenant
        elif eid < holders[seq] and tenant == facts[holders[seq]]["e"].get("tenant_id"):
            # a duplicate of the same owner's: the smaller id holds the seq, whichever
            # came first (a claim carrying another tenant than the holder's never does)
            out.reasons[holders[seq]] = DUPLICATE_SEQ
            holders[seq] = eid
        else:
            out.reasons[eid] = DUPLICATE_SEQ
    out.terminal = next(
        ((s, eid) for s, eid in holders.items() if facts[eid]["t"] in _TERMINAL),
        None,
    )
    top = out.terminal[0] if out.terminal is not None else None
    taken_keys: set[tuple[int, int]] = set()
    taken_entries: set[str] = set()
    for seq, eid in holders.items():
        f = facts[eid]
        if top is not None and seq > top:
            terminal = f["t"] in _TERMINAL
            out.reasons[eid] = CONFLICTING_TERMINAL if terminal else POST_TERMINAL
            continue
        key = _reported_turn_usage(f)
        if key is not None:
            entry = f["d"].get("entryId")
            if key in taken_keys or (entry is not None and entry in taken_entries):
                out.reasons[eid] = DUPLICATE_USAGE
                continue
            taken_keys.add(key)
            if entry is not None:
                taken_entries.add(entry)
        out.accepted.append((seq, eid))
    for _, eid in out.accepted:
        f = facts[eid]
        if _is_superseded_estimate(f, taken_keys):
            out.superseded.add(eid)
    out.meta = _meta(facts, out.accepted, owner)
    _gaps(out, holders, top)
    return out


def _is_superseded_estimate(f: dict[str, Any], reported: set[tuple[int, int]]) -> bool:
    """An estimated provider_turn row for a (turn, attempt) that has a reported row."""
    if f["t"] != "usage_recorded":
        return False
    d = f["d"]
    return (
        d["scope"] == "provider_turn"
        and bool(d["usage"].get("estimated"))
        and (d["turn"], d["attempt"]) in reported
    )


def _reported_turn_usage(f: dict[str, Any]) -> tuple[int, int] | None:
    if f["t"] != "usage_recorded":
        return None
    d = f["d"]
    if d["scope"] != "provider_turn" or d["usage"].get("estimated"):
        return None
    return d["turn"], d["attempt"]


def _meta(
    facts: dict[str, dict[str, Any]], accepted: list[tuple[int, str]], owner: str | None
) -> dict[str, Any]:
    """Envelope values: each from the lowest-seq accepted event carrying it; tenant = owner."""
    meta: dict[str, Any] = {}
    seen = meta.keys()
    last: dict[str, Any] | None = None
    for _, eid in accepted:
        e = facts[eid]["e"]
        if e is last:  # a run's facts mostly share one envelope (``Processor._add``)
            continue
        last = e
        if e.keys() <= seen:  # the common case: nothing this run has not shown yet
            continue
        for name in e.keys() - seen:
            meta[name] = e[name]
        if len(meta) == len(ENVELOPE_FIELDS):
            break
    meta.pop("tenant_id", None)
    if owner is not None:
        meta["tenant_id"] = owner
    return meta


def _gaps(out: Classified, holders: dict[int, str], top: int | None) -> None:
    if holders:
        out.missing, out.missing_count = seq_gaps(holders, max(holders) if top is None else top)


def seq_gaps(seqs: Iterable[int], top: int) -> tuple[list[tuple[int, int]], int]:
    """Seqs in ``0..top`` absent from ``seqs``: at most ``MAX_GAP_RANGES`` inclusive ranges,
    and the count of every missing seq. Cost follows the seqs present, not their values.
    """
    ranges: list[tuple[int, int]] = []
    count = 0
    expected = 0
    for seq in sorted(s for s in set(seqs) if s <= top):
        if seq > expected:
            count += seq - expected
            if len(ranges) < MAX_GAP_RANGES:
                ranges.append((expected, seq - 1))
        expected = seq + 1
    return ranges, count
