"""Per-run ground truth over the set of a run's distinct events (written apart from the core).

The rules, applied in this order to the distinct valid events of one ``runId`` (an
``eventId`` seen again is a duplicate and changes nothing), in the order the pipeline
first sees them:

a, b. Walking the seqs upwards: of the events claiming a ``seq`` that agree with the
   owner, the first to arrive holds it, unless another with the same ``tenantId`` field
   (a duplicate) has a smaller ``eventId``: then that one does (rule 10: which duplicate
   counts cannot depend on arrival). The others are ``tenant_mismatch`` (another tenant
   than the owner's) or ``duplicate_seq`` (rule 1). The owner is the ``tenantId`` of the
   lowest holder carrying one; events omitting it inherit it. ``accountId``/``userId``
   come from the lowest accepted event carrying them.
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
    # ``events`` come in the order the pipeline first sees them: between claims of one seq
    # by different tenants the first to arrive holds it; between duplicates, the smaller id
    arrival = {ev["eventId"]: i for i, ev in enumerate(events)}
    ordered = sorted(events, key=lambda ev: (int(ev["seq"]), arrival[ev["eventId"]]))
    owner: str | None = None
    by_seq: dict[int, dict[str, Any]] = {}
    for ev in ordered:  # a, b. walking seqs upwards: the owner, one holder per seq
        tenant, seq = ev.get("tenantId"), int(ev["seq"])
        holder = by_seq.get(seq)
        if not (tenant is None or owner is None or tenant == owner):
            truth.quarantined[ev["eventId"]] = "tenant_mismatch"
        elif holder is None:
            by_seq[seq] = ev
            if owner is None:
                owner = tenant
        elif ev["eventId"] < holder["eventId"] and tenant == holder.get("tenantId"):
            truth.quarantined[holder["eventId"]] = "duplicate_seq"
            by_seq[seq] = ev
        else:
            truth.quarantined[ev["eventId"]] = "duplicate_seq"
    holders = [by_seq[seq] for seq in sorted(by_seq)]
    truth.owner = owner
    truth.held_seqs = set(by_seq)
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
    truth.account_id = next((ev["accountId"] for ev in truth.accepted if ev.get("accountId")), None)
    truth.user_id = next((ev["userId"] for ev in truth.accepted if ev.get("userId")), None)
    truth.max_event_ms = max((ts_ms(ev) for ev in truth.accepted), default=0)
    return truth
