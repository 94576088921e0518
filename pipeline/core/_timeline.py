"""Derive a run's record, its turn rows and its closed timeline from its facts (pure).

Facts hold the wire-form ``data`` of each applied event (camelCase keys, absent fields
omitted), so every rule here reads CONTRACT.md's vocabulary directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from prism.schemas import RunRow

from ._classify import Classified
from ._run import ENVELOPE_FIELDS, RunState, from_us, iso_us

__all__ = ["RunView", "closed_record", "run_row", "turn_cache_inputs", "view_of"]

_TERMINAL_STATUS = {"agent_finished": "succeeded", "agent_denied": "denied", "error": "failed"}
_MISMATCH_FIELDS = ("inputTokens", "outputTokens", "totalTokens")


def turn_cache_inputs(d: dict[str, Any]) -> tuple[int | None, int | None, int | None]:
    """(cache read, cache write, input tokens) a provider turn reports; None when absent."""
    # typed: compiled, .get is a dict's, not a method call on an object
    cache: dict[str, Any] = d.get("cache") or {}
    usage: dict[str, Any] = d.get("usage") or {}
    budgets: dict[str, Any] = d.get("budgets") or {}
    read = cache.get("cacheReadTokens", usage.get("cacheReadTokens"))
    write = cache.get("cacheWriteTokens", usage.get("cacheWriteTokens"))
    inp = usage.get("inputTokens", budgets.get("inputTokens"))
    return read, write, inp


def _usage_priority(usage: dict[str, Any]) -> int:
    return 0 if usage.get("estimated") else 1


# (priority: reported 1 over estimated 0, seq, usage, event id)
_Offer = tuple[int, int, dict[str, Any], str]


@dataclass(slots=True)
class RunView:
    """One pass over a run's facts: everything its rows and timeline need."""

    status: str
    cls: Classified
    model_turns: set[int] = field(default_factory=set)
    deterministic_turns: set[int] = field(default_factory=set)
    tool_calls: int = 0
    cache_read: int = 0
    cache_input: int = 0
    cache_turns: int = 0
    started_us: int | None = None
    limit: dict[str, Any] | None = None
    exhausted: dict[str, Any] | None = None
    started_seq: int | None = None
    first_us: int | None = None
    last_us: int | None = None
    # (kind, turn, attempt) -> (seq, event id) of the turn's event: the highest seq wins
    turn_seq: dict[tuple[str, int, int], tuple[int, str]] = field(default_factory=dict)
    # usage shown on a turn: the turn event's own usage or a usage_recorded row
    turn_usage: dict[tuple[int, int], _Offer] = field(default_factory=dict)
    # the ledger's provider_turn usage rows only (billing and the run_total check)
    row_usage: dict[tuple[int, int], _Offer] = field(default_factory=dict)
    run_total: dict[str, Any] | None = None
    children: dict[str, dict[str, Any]] = field(default_factory=dict)
    clamps: list[dict[str, Any]] = field(default_factory=list)
    terminal: dict[str, Any] | None = None
    # an accepted event was stamped beyond the clock plus the skew (rule 14): a quarantined
    # one changes nothing (rule 2), so a late one read from a tombstone would not show it
    clock_skew: bool = False

    @property
    def cache_hit_rate(self) -> float | None:
        if self.cache_turns == 0 or self.cache_input <= 0:
            return None
        return self.cache_read / self.cache_input

    def effective_usage(self) -> dict[tuple[int, int], dict[str, Any]]:
        """The run's provider_turn usage rows, one per (turn, attempt): reported wins."""
        return {k: v[2] for k, v in self.row_usage.items()}

    @property
    def usage_mismatch(self) -> bool:
        """run_total disagrees with the provider_turn rows; only when both exist (rule 12)."""
        if self.run_total is None or not self.row_usage:
            return False
        eff = self.effective_usage().values()
        for name in _MISMATCH_FIELDS:
            if name in self.run_total and self.run_total[name] != sum(u.get(name, 0) for u in eff):
                return True
        return False


def view_of(run: RunState, cls: Classified) -> RunView:
    """Fold a run's accepted facts (in seq order) into a ``RunView``."""
    view = RunView(status="running", cls=cls)
    suspended = False
    for seq, eid in cls.accepted:
        f = run.facts[eid]
        t, d = f["t"], f["d"]
        ts = f["ts"]
        if "k" in f:
            view.clock_skew = True
        if view.first_us is None or ts < view.first_us:
            view.first_us = ts
        if view.last_us is None or ts > view.last_us:
            view.last_us = ts
        if t == "provider_turn_finished":
            turn, attempt = d["turn"], d["attempt"]
            view.model_turns.add(turn)
            view.turn_seq[("model", turn, attempt)] = (seq, eid)
            read, _write, inp = turn_cache_inputs(d)
            if read is not None and inp is not None:
                view.cache_read += read
                view.cache_input += inp
                view.cache_turns += 1
            if "usage" in d:
                _offer_usage(view.turn_usage, (turn, attempt), seq, d["usage"], eid)
        elif t == "usage_recorded":
            if d["scope"] == "provider_turn":
                key = (d["turn"], d["attempt"])
                _offer_usage(view.turn_usage, key, seq, d["usage"], eid)
                _offer_usage(view.row_usage, key, seq, d["usage"], eid)
            else:
                view.run_total = d["usage"]
        elif t == "deterministic_turn_finished":
            view.deterministic_turns.add(d["turn"])
            view.turn_seq[("deterministic", d["turn"], 0)] = (seq, eid)
        elif t == "tool_call_finished":
            view.tool_calls += 1
        elif t == "agent_started":
            if view.started_seq is None:
                view.started_us, view.started_seq = ts, seq
        elif t == "run_limit_exceeded":
            view.limit = d
        elif t == "budget_exhausted":
            view.exhausted = d
        elif t == "run_suspended":
            suspended = True
        elif t == "run_resumed":
            suspended = False
        elif t in ("child_milestone", "child_failed"):
            child = view.children.setdefault(
                d["delegationId"],
                {"delegationId": d["delegationId"], "childId": d["childId"], "milestones": 0},
            )
            if d.get("childRunId"):
                child["childRunId"] = d["childRunId"]
            if t == "child_milestone":
                child["milestones"] += 1
            else:
                child["failed"] = {"error": d["error"], "breach": d.get("breach")}
        elif t in ("delegation_child_events_capped", "delegation_child_events_coalesced"):
            child = view.children.setdefault(
                d["delegationId"], {"delegationId": d["delegationId"], "milestones": 0}
            )
            if t.endswith("capped"):
                child["eventsCapped"] = d["cap"]
            else:
                child["eventsCoalesced"] = child.get("eventsCoalesced", 0) + d["dropped"]
        elif t == "tool_narrowing_clamped":
            view.clamps.append({"turn": d["turn"], "dropped": d["dropped"]})
    if cls.terminal is not None:
        term = run.facts[cls.terminal[1]]
        view.terminal = term
        status = _TERMINAL_STATUS[term["t"]]
        if term["t"] == "error" and term["d"].get("aborted"):
            status = "aborted"
        view.status = status
    elif run.incomplete:
        view.status = "incomplete"
    elif suspended:
        view.status = "suspended"
    return view


def _offer_usage(
    best_by_key: dict[tuple[int, int], _Offer],
    key: tuple[int, int],
    seq: int,
    usage: dict[str, Any],
    eid: str,
) -> None:
    """Reported usage wins over an estimate for the same turn; then the later seq wins."""
    cand = (_usage_priority(usage), seq, usage, eid)
    best = best_by_key.get(key)
    if best is None or cand[:2] > best[:2]:
        best_by_key[key] = cand


def run_row(run: RunState, view: RunView, *, timeline: bool, version: int | None = None) -> RunRow:
    """The run's ledger record; ``timeline`` adds the closed-record JSON; ``version``: the
    row's version (default the run's own, ``Processor.row_version`` adds the generation)."""
    term = view.terminal
    td: dict[str, Any] = term["d"] if term is not None else {}
    err = td.get("error") or {} if term is not None and term["t"] == "error" else {}
    limit, exh = view.limit or {}, view.exhausted or {}
    m = view.cls.meta.get
    started = view.started_us if view.started_us is not None else view.first_us
    return RunRow(
        run_id=run.run_id,
        **{name: m(name) for name in ENVELOPE_FIELDS},
        status=view.status,
        terminal_type=term["t"] if term is not None else None,
        terminal_seq=view.cls.terminal[0] if view.cls.terminal is not None else None,
        started_at=from_us(started) if started is not None else None,
        finished_at=from_us(term["ts"]) if term is not None else None,
        last_event_at=from_us(view.last_us or 0),
        stop_reason=td.get("stopReason") if term and term["t"] == "agent_finished" else None,
        stop_detail=td.get("stopDetail"),
        finish_reason=td.get("finishReason"),
        error_code=err.get("code"),
        error_message=err.get("message"),
        failure_class=err.get("failureClass"),
        abort_reason=td.get("abortReason"),
        denied_reason=td.get("reason") if term and term["t"] == "agent_denied" else None,
        model_turns=len(view.model_turns),
        deterministic_turns=len(view.deterministic_turns),
        tool_calls=view.tool_calls,
        cache_hit_rate=view.cache_hit_rate,
        exhaustion_limit=limit.get("limit"),
        exhaustion_maximum=_num(limit.get("maximum")),
        exhaustion_observed=_num(limit.get("observed")),
        exhaustion_axis=exh.get("axis"),
        exhaustion_closest=orjson.dumps(exh["closest"]).decode() if "closest" in exh else None,
        missing_ranges=view.cls.missing,
        missing_count=view.cls.missing_count,
        usage_mismatch=view.usage_mismatch,
        clock_skew=view.clock_skew,
        event_count=len(view.cls.accepted),
        max_seq=view.cls.accepted[-1][0] if view.cls.accepted else -1,
        closed=run.closed,
        timeline=orjson.dumps(closed_record(run, view)).decode() if timeline else "",
        version=run.version if version is None else version,
    )


def _num(v: Any) -> float | None:
    return None if v is None else float(v)


def closed_record(run: RunState, view: RunView) -> dict[str, Any]:
    """The run's final timeline summary (``prism.runs.closed`` value, ``runs.timeline``)."""
    m = view.cls.meta.get
    term = view.terminal
    td = term["d"] if term is not None else {}
    eff = view.effective_usage()
    reported = [u for u in eff.values() if not u.get("estimated")]
    estimated = [u for u in eff.values() if u.get("estimated")]
    exhaustion = None
    if view.limit is not None or view.exhausted is not None:
        exhaustion = {**(view.limit or {}), **(view.exhausted or {})}
    return {
        "schema": "prism.run-closed/v1",
        "runId": run.run_id,
        "status": view.status,
        "terminal": None
        if term is None
        else {
            "type": term["t"],
            "seq": view.cls.terminal[0] if view.cls.terminal else None,
            "eventId": view.cls.terminal[1] if view.cls.terminal else None,
        },
        "startedAt": _iso(view.started_us if view.started_us is not None else view.first_us),
        "finishedAt": _iso(term["ts"]) if term is not None else None,
        "stopReason": td.get("stopReason") if term and term["t"] == "agent_finished" else None,
        "stopDetail": td.get("stopDetail"),
        "finishReason": td.get("finishReason"),
        "error": td.get("error"),
        "aborted": bool(td.get("aborted")),
        "tenantId": m("tenant_id"),
        "accountId": m("account_id"),
        "userId": m("user_id"),
        "sessionId": m("session_id"),
        "agent": {"id": m("agent_id"), "definitionRevision": m("agent_definition_revision")},
        "model": {"provider": m("provider"), "model": m("model")},
        "parent": None
        if m("parent_run_id") is None
        else {
            "runId": m("parent_run_id"),
            "delegationId": m("delegation_id"),
            "childId": m("child_id"),
        },
        "bundleDigest": m("bundle_digest"),
        "turns": {"model": len(view.model_turns), "deterministic": len(view.deterministic_turns)},
        "toolCalls": view.tool_calls,
        "cacheHitRate": view.cache_hit_rate,
        "exhaustion": exhaustion,
        "missingSeqs": {
            "ranges": [list(r) for r in view.cls.missing],
            "count": view.cls.missing_count,
        },
        "clockSkew": view.clock_skew,
        "usage": {
            "reported": _sum_usage(reported),
            "estimated": _sum_usage(estimated),
            "runTotal": view.run_total,
            "mismatch": view.usage_mismatch,
        },
        "children": list(view.children.values()),
        "toolNarrowing": view.clamps,
        "steps": [
            {"seq": s, "type": run.facts[e]["t"], "ts": iso_us(run.facts[e]["ts"])}
            for s, e in view.cls.accepted
        ],
        "eventCount": len(view.cls.accepted),
    }


def _sum_usage(rows: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for u in rows:
        for k in (
            "inputTokens",
            "outputTokens",
            "totalTokens",
            "cacheReadTokens",
            "cacheWriteTokens",
        ):
            if k in u:
                out[k] = out.get(k, 0) + u[k]
    return out


def _iso(us: int | None) -> str | None:
    return None if us is None else iso_us(us)
