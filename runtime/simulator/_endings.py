"""How simulated runs end: finishes, denials, provider errors, aborts, limit deaths, delegations."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._builder import hex_id

if TYPE_CHECKING:
    from ._runs import RunGen

__all__ = ["delegate", "finish"]

_PROVIDER_ERRORS: dict[str, tuple[str, str]] = {
    "quota": ("PROVIDER_QUOTA_EXCEEDED", "429 insufficient_quota: monthly spend limit reached"),
    "auth": ("PROVIDER_AUTH_FAILED", "401 invalid api key [REDACTED]"),
    "rate_limited": ("PROVIDER_RATE_LIMITED", "429 too many requests; retry-after 20s"),
    "transient": ("PROVIDER_UNAVAILABLE", "503 upstream overloaded (ECONNRESET)"),
    "permanent": ("PROVIDER_BAD_REQUEST", "400 prompt exceeds the model context window"),
    "unknown": ("PROVIDER_ERROR", "unexpected provider response"),
}
_STOPS: dict[str, tuple[str, dict[str, Any]]] = {
    # outcome -> (last turn's stopReason, agent_finished data)
    "success": ("end_turn", {"finishReason": "stop"}),
    "host_policy": (
        "tool_calls",
        {"stopReason": "host_policy", "stopDetail": "turnPolicy: tenant spend window closed"},
    ),
    "turn_limit": (
        "tool_calls",
        {"stopReason": "turn_limit", "stopDetail": "loop reached its configured turn count"},
    ),
    "token_limit": (
        "max_output_tokens",
        {
            "stopReason": "token_limit",
            "finishReason": "length",
            "stopDetail": "output token cap reached",
        },
    ),
    "refusal": (
        "content_filter",
        {"stopReason": "refusal", "stopDetail": "provider content filter"},
    ),
}


def finish(g: RunGen) -> None:
    """Generate the turns and the ending the plan asks for."""
    plan, b, rng = g.plan, g.b, g.rng
    outcome = plan.outcome
    if outcome in _STOPS:
        stop, data = _STOPS[outcome]
        g.turns(plan.turns, stop)
        g.run_total()
        b.advance(5, 200)
        b.emit("agent_finished", dict(data), terminal=True)
    elif outcome == "denied":
        g.turns(plan.turns, "end_turn")
        g.flush_pending()
        reason = (
            "input guardrail pii-detector blocked the request"
            if plan.turns
            else ("account is not allowed to run this agent")
        )
        b.emit("agent_denied", {"reason": reason}, terminal=True)
    elif outcome == "provider_error":
        g.turns(plan.turns, "tool_calls")
        g.run_total()
        g.turn += 1
        cls = plan.detail or "unknown"
        tries = rng.randint(2, 3) if cls in ("rate_limited", "transient") else 1
        for attempt in range(1, tries + 1):
            g.failed_attempt(attempt)
        code, message = _PROVIDER_ERRORS[cls]
        b.emit(
            "error",
            {"error": {"code": code, "message": message, "failureClass": cls}},
            terminal=True,
        )
    elif outcome == "aborted":
        g.turns(max(1, plan.turns), "abort")
        g.run_total()
        reason = rng.choice(("user_cancelled", "host_shutdown", "client_disconnected"))
        b.emit(
            "error",
            {
                "error": {"code": "ABORTED", "message": f"run aborted: {reason}"},
                "aborted": True,
                "abortReason": reason,
            },
            terminal=True,
        )
    elif outcome == "limit_death":
        g.turns(max(1, plan.turns), "tool_calls")
        g.run_total()
        _limit_death(g, plan.detail or "maxTurns", terminal=True)
    else:  # stale / fresh: never finishes
        g.turns(max(1, plan.turns), "tool_calls")
        g.flush_pending()
        if plan.limit_pending:
            _limit_death(g, "maxWallMs", terminal=False)
        elif plan.ends_suspended:
            b.emit("run_suspended", {"reason": "awaiting_approval"})


def _breach(g: RunGen, axis: str) -> tuple[int | float, int | float]:
    """(maximum, observed) of a breach on ``axis``; the run's limits are set to match."""
    rng, limits = g.rng, g.limits
    if axis == "maxTurns":
        return limits["maxTurns"], g.model_turns + 1
    if axis == "maxInputTokens":
        observed = g.run_input
        maximum = max(1, observed - int(g.prev_input * rng.uniform(0.1, 0.9)))
        limits["maxInputTokens"] = maximum
        for budgets in g.budgets:
            budgets["runInputBudget"] = maximum
        return maximum, observed
    if axis == "maxWallMs":
        observed = g.b.now - g.start_ms
        maximum = max(1_000, (observed - 1) // 1_000 * 1_000)
        limits["maxWallMs"] = maximum
        return maximum, max(observed, maximum + 1)
    # maxCost: observed spend in the tenant's currency
    observed_cost = round(g.cost6 / 1_000_000, 6)
    maximum_cost = round(observed_cost * rng.uniform(0.5, 0.95), 4) or 0.0001
    if maximum_cost >= observed_cost:
        observed_cost = maximum_cost + 0.000001
    limits["maxCost"] = {"amount": maximum_cost, "currency": g.currency}
    return maximum_cost, round(observed_cost, 6)


def _limit_death(g: RunGen, axis: str, terminal: bool) -> None:
    """run_limit_exceeded, then budget_exhausted, then (if terminal) error."""
    b = g.b
    maximum, observed = _breach(g, axis)
    data: dict[str, Any] = {"limit": axis, "maximum": maximum, "observed": observed}
    if axis == "maxCost":
        data["currency"] = g.currency
    b.advance(1, 30)
    b.emit("run_limit_exceeded", data)
    counters: dict[str, Any] = {
        "turns": g.model_turns,
        "providerAttempts": g.attempts,
        "toolCalls": g.tool_calls,
        "wallMs": b.now - g.start_ms,
        "inputTokens": g.run_input,
        "outputTokens": g.run_output,
        "totalTokens": g.run_input + g.run_output,
    }
    used = {
        "maxTurns": g.model_turns,
        "maxToolCalls": g.tool_calls,
        "maxWallMs": b.now - g.start_ms,
        "maxInputTokens": g.run_input,
        "maxOutputTokens": g.run_output,
        "maxTotalTokens": g.run_input + g.run_output,
    }
    ranked = sorted((used[a] / g.limits[a], a) for a in used if a != axis and g.limits.get(a))
    closest = [{"axis": a, "used": used[a], "maximum": g.limits[a]} for _, a in ranked[-3:][::-1]]
    b.advance(1, 5)
    b.emit(
        "budget_exhausted",
        {
            "axis": axis,
            "counters": counters,
            "closest": closest,
            "lastToolCallHashes": g.call_hashes[-10:],
        },
    )
    if terminal:
        b.advance(1, 5)
        message = f"run limit {axis} exceeded: observed {observed} > maximum {maximum}"
        b.emit(
            "error", {"error": {"code": "RUN_LIMIT_EXCEEDED", "message": message}}, terminal=True
        )


def delegate(g: RunGen) -> None:
    """Hand work to a child run; report its milestone or failure back on the parent."""
    child_plan = g.plan.child
    assert child_plan is not None
    rng, b = g.rng, g.b
    delegation_id = "dlg_" + hex_id(rng)
    child_id = rng.choice(("researcher", "summarizer", "verifier", "coder"))
    b.advance(10, 80)
    child = g.spawn(
        child_plan,
        b.now,
        parent={"runId": g.run_id, "delegationId": delegation_id, "childId": child_id},
    )
    child.generate()
    g.children.append(child)
    child_events = child.b.events
    b.now = max(b.now, child_events[-1][0]) + rng.randint(5, 120)
    ref = {"delegationId": delegation_id, "childId": child_id, "childRunId": child.run_id}
    if g.plan.capped:
        b.emit("delegation_child_events_capped", {"delegationId": delegation_id, "cap": 256})
        b.advance(1, 10)
    if g.plan.coalesced:
        b.emit(
            "delegation_child_events_coalesced",
            {"delegationId": delegation_id, "dropped": rng.randint(3, 120)},
        )
        b.advance(1, 10)
    ok = child_plan.outcome != "limit_death"
    if ok:
        b.emit("child_milestone", {**ref, "turn": g.turn})
    else:
        breach = next(ev["data"] for _, ev in child_events if ev["type"] == "run_limit_exceeded")
        error = {
            "code": "CHILD_LIMIT_EXCEEDED",
            "message": f"child {child_id} exceeded {breach['limit']}",
            "failureClass": "permanent",
        }
        b.emit(
            "child_failed",
            {
                **ref,
                "error": error,
                "breach": {k: breach[k] for k in ("limit", "maximum", "observed")},
            },
        )
    b.advance(1, 20)
    g.tool_calls += 1
    call_hash = hex_id(rng)
    g.call_hashes.append(call_hash)
    data: dict[str, Any] = {
        "turn": g.turn,
        "tool": "delegate",
        "callIdHash": call_hash,
        "durationMs": b.now - child.start_ms,
        "ok": ok,
    }
    if not ok:
        data["errorCode"] = "CHILD_FAILED"
    b.emit("tool_call_finished", data)
    b.advance(1, 30)
