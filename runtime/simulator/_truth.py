"""Per-run ground truth over the SET of a run's distinct events, independent of arrival order.

The rules, applied in this order to the distinct valid events of one ``runId`` (an
``eventId`` seen again is a duplicate and changes nothing):

a. Owner: the ``tenantId`` of the event with the smallest ``(seq, eventId)`` among those
   carrying one. Events carrying another tenant are ``tenant_mismatch``; events omitting
   it inherit the owner's. ``accountId``/``userId`` come from the lowest such remaining
   event carrying them.
b. Per ``seq`` the holder is the event with the smallest ``eventId``; the others are
   ``duplicate_seq``.
c. The terminal is the holder with the smallest ``seq`` among terminal types; holders
   above it are ``conflicting_terminal`` (terminal type) or ``post_terminal``.
d. Reported ``provider_turn`` usage rows, in ``seq`` order: a row whose ``(turn,
   attempt)`` or non-null ``entryId`` equals an earlier accepted reported row's is
   ``duplicate_usage``.
e. Everything else is accepted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

__all__ = ["QUARANTINE_REASONS", "TERMINAL_TYPES", "RunTruth", "judge_run", "ts_ms"]

TERMINAL_TYPES = frozenset({"agent_finished", "agent_denied", "error"})
QUARANTINE_REASONS = (
    "post_terminal",
    "conflicting_terminal",
    "duplicate_seq",
    "tenant_mismatch",
    "duplicate_usage",
)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)


def ts_ms(ev: dict[str, Any]) -> int:
    """An event's ``ts`` (RFC 3339 with an offset) in epoch milliseconds."""
    return (datetime.fromisoformat(ev["ts"]) - _EPOCH) // _MS


def _is_reported_turn_usage(ev: dict[str, Any]) -> bool:
    data = ev["data"]
    return (
        ev["type"] == "usage_recorded"
        and data.get("scope") == "provider_turn"
        and data["usage"].get("estimated") is not True
    )


@dataclass(slots=True)
class RunTruth:
    """What a correct pipeline concludes about one run from its set of events."""

    run_id: str
    owner: str | None = None
    account_id: str | None = None
    user_id: str | None = None
    quarantined: dict[str, str] = field(default_factory=dict)  # eventId -> reason
    accepted: list[dict[str, Any]] = field(default_factory=list)  # in seq order
    held_seqs: set[int] = field(default_factory=set)  # seqs with a holder (gaps exclude them)
    terminal: dict[str, Any] | None = None
    max_event_ms: int = 0  # latest ts over the run's own (tenant-consistent) events

    @property
    def last_accepted_ms(self) -> int:
        return max(ts_ms(ev) for ev in self.accepted)

    def first_with(self, name: str) -> Any:
        """The value of envelope field ``name`` on the lowest-seq accepted event carrying it."""
        return next((ev[name] for ev in self.accepted if ev.get(name) is not None), None)


def judge_run(run_id: str, events: list[dict[str, Any]]) -> RunTruth:
    """Apply rules a-e to the distinct valid events of one run."""
    truth = RunTruth(run_id)
    ordered = sorted(events, key=lambda ev: (int(ev["seq"]), ev["eventId"]))
    owner = next((ev["tenantId"] for ev in ordered if ev.get("tenantId") is not None), None)
    truth.owner = owner
    consistent = []
    for ev in ordered:  # a. ownership
        tenant = ev.get("tenantId")
        if tenant is not None and tenant != owner:
            truth.quarantined[ev["eventId"]] = "tenant_mismatch"
        else:
            consistent.append(ev)
    truth.account_id = next((ev["accountId"] for ev in consistent if ev.get("accountId")), None)
    truth.user_id = next((ev["userId"] for ev in consistent if ev.get("userId")), None)
    truth.max_event_ms = max((ts_ms(ev) for ev in consistent), default=0)
    holders: list[dict[str, Any]] = []
    for ev in consistent:  # b. one holder per seq (events are sorted by seq, eventId)
        if holders and holders[-1]["seq"] == ev["seq"]:
            truth.quarantined[ev["eventId"]] = "duplicate_seq"
        else:
            holders.append(ev)
    truth.held_seqs = {int(ev["seq"]) for ev in holders}
    terminal = next((ev for ev in holders if ev["type"] in TERMINAL_TYPES), None)
    truth.terminal = terminal
    kept = []
    for ev in holders:  # c. one terminal per run
        if terminal is not None and ev["seq"] > terminal["seq"]:
            reason = "conflicting_terminal" if ev["type"] in TERMINAL_TYPES else "post_terminal"
            truth.quarantined[ev["eventId"]] = reason
        else:
            kept.append(ev)
    turns: set[tuple[int, int]] = set()
    entries: set[str] = set()
    for ev in kept:  # d. one reported usage per turn attempt
        if _is_reported_turn_usage(ev):
            data = ev["data"]
            key = (int(data["turn"]), int(data["attempt"]))
            entry = data.get("entryId")
            if key in turns or (entry is not None and entry in entries):
                truth.quarantined[ev["eventId"]] = "duplicate_usage"
                continue
            turns.add(key)
            if entry is not None:
                entries.add(entry)
        truth.accepted.append(ev)  # e.
    return truth
