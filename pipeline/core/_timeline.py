"""Derive a run's record, its turn rows and its closed timeline from its facts (pure).

Facts hold the wire-form ``data`` of each applied event (camelCase keys, absent fields
omitted), so every rule here reads CONTRACT.md's vocabulary directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from prism.schemas import RunRow, TurnRow

from ._run import ENVELOPE_FIELDS, RunState, from_us

__all__ = ["RunView", "view_of"]

_TERMINAL_STATUS = {"agent_finished": "succeeded", "agent_denied": "denied", "error": "failed"}
_MISMATCH_FIELDS = ("inputTokens", "outputTokens", "totalTokens")


def _turn_cache_inputs(d: dict[str, Any]) -> tuple[int | None, int | None, int | None]:
    """(cache read, cache write, input tokens) a provider turn reports; None when absent."""
    cache = d.get("cache") or {}
    usage = d.get("usage") or {}
    read = cache.get("cacheReadTokens", usage.get("cacheReadTokens"))
    write = cache.get("cacheWriteTokens", usage.get("cacheWriteTokens"))
    inp = usage.get("inputTokens", (d.get("budgets") or {}).get("inputTokens"))
    return read, write, inp


def _usage_priority(usage: dict[str, Any]) -> int:
    return 0 if usage.get("estimated") else 1


@dataclass(slots=True)
class RunView:
    """One pass over a run's facts: everything its rows and timeline need."""

    status: str
    model_turns: set[int] = field(default_factory=set)
    deterministic_turns: set[int] = field(default_factory=set)
    tool_calls: int = 0
    cache_read: int = 0
    cache_input: int = 0
    cache_turns: int = 0
    started_us: int | None = None
    limit: dict[str, Any] | None = None
    exhausted: dict[str, Any] | None = None
    turn_seq: dict[tuple[str, int, int], int] = field(default_factory=dict)
    # usage shown on a turn: the turn event's own usage or a usage_recorded row
    turn_usage: dict[tuple[int, int], tuple[int, int, dict[str, Any]]] = field(default_factory=dict)
    # the ledger's provider_turn usage rows only (billing and the run_total check)
    row_usage: dict[tuple[int, int], tuple[int, int, dict[str, Any]]] = field(default_factory=dict)
    run_total: dict[str, Any] | None = None
    children: dict[str, dict[str, Any]] = field(default_factory=dict)
    clamps: list[dict[str, Any]] = field(default_factory=list)
    terminal: dict[str, Any] | None = None

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
        if self.run_total is None:
            return False
        eff = self.effective_usage().values()
        for name in _MISMATCH_FIELDS:
            if name in self.run_total and self.run_total[name] != sum(u.get(name, 0) for u in eff):
                return True
        return False


def view_of(run: RunState) -> RunView:
    """Fold a run's facts (in seq order) into a ``RunView``."""
    view = RunView(status="running")
    suspended = False
    for seq in sorted(run.facts):
        f = run.facts[seq]
        t, d = f["t"], f["d"]
        if t == "provider_turn_finished":
            turn, attempt = d["turn"], d["attempt"]
            view.model_turns.add(turn)
            view.turn_seq[("model", turn, attempt)] = seq
            read, _write, inp = _turn_cache_inputs(d)
            if read is not None and inp is not None:
                view.cache_read += read
                view.cache_input += inp
                view.cache_turns += 1
            if "usage" in d:
                _offer_usage(view.turn_usage, (turn, attempt), seq, d["usage"])
        elif t == "usage_recorded":
            if d["scope"] == "provider_turn":
                key = (d["turn"], d["attempt"])
                _offer_usage(view.turn_usage, key, seq, d["usage"])
                _offer_usage(view.row_usage, key, seq, d["usage"])
            else:
                view.run_total = d["usage"]
        elif t == "deterministic_turn_finished":
            view.deterministic_turns.add(d["turn"])
            view.turn_seq[("deterministic", d["turn"], 0)] = seq
        elif t == "tool_call_finished":
            view.tool_calls += 1
        elif t == "agent_started":
            view.started_us = f["ts"]
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
    if run.terminal is not None and run.terminal["seq"] in run.facts:
        term = run.facts[run.terminal["seq"]]
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
    best_by_key: dict[tuple[int, int], tuple[int, int, dict[str, Any]]],
    key: tuple[int, int],
    seq: int,
    usage: dict[str, Any],
) -> None:
    """Reported usage wins over an estimate for the same turn; then the later seq wins."""
    cand = (_usage_priority(usage), seq, usage)
    best = best_by_key.get(key)
    if best is None or cand[:2] > best[:2]:
        best_by_key[key] = cand


def run_row(run: RunState, view: RunView, *, timeline: bool) -> RunRow:
    """The run's ledger record; ``timeline`` adds the closed-record JSON."""
    term = view.terminal
    td: dict[str, Any] = term["d"] if term is not None else {}
    err = td.get("error") or {} if term is not None and term["t"] == "error" else {}
    limit, exh = view.limit or {}, view.exhausted or {}
    m = run.meta_value
    started = view.started_us if view.started_us is not None else run.first_us
    return RunRow(
        run_id=run.run_id,
        **{name: m(name) for name in ENVELOPE_FIELDS},
        status=view.status,
        terminal_type=term["t"] if term is not None else None,
        terminal_seq=run.terminal["seq"] if term is not None and run.terminal else None,
        started_at=from_us(started) if started is not None else None,
        finished_at=from_us(term["ts"]) if term is not None else None,
        last_event_at=from_us(run.last_us or 0),
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
        missing_seqs=run.missing_seqs(),
        usage_mismatch=view.usage_mismatch,
        event_count=len(run.facts),
        max_seq=max(run.facts, default=-1),
        closed=run.closed,
        timeline=orjson.dumps(closed_record(run, view)).decode() if timeline else "",
        version=run.revision,
    )


def _num(v: Any) -> float | None:
    return None if v is None else float(v)


def turn_rows(
    run: RunState, view: RunView, keys: set[tuple[str, int, int]] | None = None
) -> list[TurnRow]:
    """Turn rows for ``keys`` (kind, turn, attempt), or for every turn when ``keys`` is None."""
    rows = []
    wanted = (
        view.turn_seq if keys is None else {k: view.turn_seq[k] for k in keys if k in view.turn_seq}
    )
    for (kind, turn, attempt), seq in sorted(wanted.items()):
        f = run.facts[seq]
        d = f["d"]
        base = {
            "run_id": run.run_id,
            "kind": kind,
            "turn": turn,
            "attempt": attempt,
            "tenant_id": run.meta_value("tenant_id"),
            "provider": run.meta_value("provider"),
            "model": run.meta_value("model"),
            "seq": seq,
            "ts": from_us(f["ts"]),
            "version": run.revision,
        }
        if kind == "deterministic":
            rows.append(TurnRow(**base, **_EMPTY_MODEL_TURN, middleware=d["middleware"]))
            continue
        read, write, inp = _turn_cache_inputs(d)
        chosen = view.turn_usage.get((turn, attempt))
        usage = chosen[2] if chosen is not None else {}
        budgets, tools = d.get("budgets") or {}, d.get("tools") or {}
        rows.append(
            TurnRow(
                **base,
                stop_reason=d.get("stopReason"),
                latency_ms=_num(d.get("latencyMs")),
                middleware=None,
                tools_count=tools.get("count"),
                tools_ids_hash=tools.get("idsHash"),
                input_tokens=usage.get("inputTokens", inp),
                output_tokens=usage.get("outputTokens"),
                total_tokens=usage.get("totalTokens"),
                cache_read_tokens=read,
                cache_write_tokens=write,
                cache_hit_rate=(read / inp) if read is not None and inp else None,
                usage_source=None
                if not usage
                else ("estimated" if usage.get("estimated") else "reported"),
                usage_confidence=usage.get("confidence"),
                input_cap=budgets.get("inputCap"),
                run_input_budget=budgets.get("runInputBudget"),
                run_input_used=budgets.get("runInputUsed"),
                max_turns=budgets.get("maxTurns"),
            )
        )
    return rows


_EMPTY_MODEL_TURN: dict[str, Any] = dict.fromkeys(
    (
        "stop_reason",
        "latency_ms",
        "tools_count",
        "tools_ids_hash",
        "input_tokens",
        "output_tokens",
        "total_tokens",
        "cache_read_tokens",
        "cache_write_tokens",
        "cache_hit_rate",
        "usage_source",
        "usage_confidence",
        "input_cap",
        "run_input_budget",
        "run_input_used",
        "max_turns",
    )
)


def closed_record(run: RunState, view: RunView) -> dict[str, Any]:
    """The run's final timeline summary (``prism.runs.closed`` value, ``runs.timeline``)."""
    m = run.meta_value
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
            "seq": run.terminal["seq"] if run.terminal else None,
            "eventId": term["id"],
        },
        "startedAt": _iso(view.started_us if view.started_us is not None else run.first_us),
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
        "missingSeqs": run.missing_seqs(),
        "usage": {
            "reported": _sum_usage(reported),
            "estimated": _sum_usage(estimated),
            "runTotal": view.run_total,
            "mismatch": view.usage_mismatch,
        },
        "children": list(view.children.values()),
        "toolNarrowing": view.clamps,
        "steps": [
            {"seq": s, "type": run.facts[s]["t"], "ts": _iso(run.facts[s]["ts"])}
            for s in sorted(run.facts)
        ],
        "eventCount": len(run.facts),
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
    return None if us is None else from_us(us).isoformat()
