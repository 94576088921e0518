"""Run plans: what each simulated run will do, drawn in realistic proportions.

With ``runs >= COVERAGE_MIN_RUNS`` the first plans are fixed so every scenario the
ground truth must exercise appears at least once; the rest are drawn at random.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Any

from ._catalog import AGENTS, MODELS, TENANTS, AgentSpec, ModelSpec, TenantSpec

__all__ = [
    "BURST_AXIS",
    "COVERAGE_MIN_RUNS",
    "FAILURE_CLASSES",
    "LIMIT_AXES",
    "RunPlan",
    "burst_plans",
    "draw_plans",
]

COVERAGE_MIN_RUNS = 200
LIMIT_AXES = ("maxTurns", "maxInputTokens", "maxWallMs", "maxCost")
FAILURE_CLASSES = ("quota", "auth", "rate_limited", "transient", "permanent", "unknown")

# outcome -> weight (per mille of top-level runs)
_OUTCOMES: dict[str, float] = {
    "success": 560,
    "host_policy": 40,
    "turn_limit": 40,
    "token_limit": 30,
    "refusal": 20,
    "limit_death": 50,
    "denied": 40,
    "provider_error": 70,
    "aborted": 40,
    "stale": 30,
    "fresh": 15,
}
_FAILURE_WEIGHTS = (10, 8, 30, 30, 12, 10)


@dataclass(slots=True)
class RunPlan:
    """Everything decided about a run before its events are generated."""

    tenant: TenantSpec
    model: ModelSpec
    agent: AgentSpec
    outcome: str
    detail: str | None = None  # limit axis or failure class
    turns: int = 3  # planned turns (model + deterministic) before the outcome
    ends_suspended: bool = False  # never-finishing runs only
    limit_pending: bool = False  # never-finishing run stuck after run_limit_exceeded
    deterministic: int = 0  # how many turns are answered by middleware
    tool_error: bool = False
    retry: bool = False
    estimate_then_report: bool = False
    narrowing: bool = False
    extension_error: bool = False
    unknown_event: bool = False
    suspend_resume: bool = False
    run_total: str | None = None  # None | "consistent" | "inconsistent"
    delegation: str | None = None  # None | "milestone" | "failed"
    capped: bool = False
    coalesced: bool = False
    guardrails: int = 0  # guardrail denials at tool rounds (knob guardrail_denials)
    burst: bool = False  # part of a limit-death burst (knob limit_death_burst)
    child: RunPlan | None = None

    @property
    def finishes(self) -> bool:
        return self.outcome not in ("stale", "fresh")


def _pick(rng: random.Random, items: tuple[Any, ...], weights: list[float]) -> Any:
    return rng.choices(items, weights)[0]


def _draw(rng: random.Random) -> RunPlan:
    tenant = _pick(rng, TENANTS, [t.weight for t in TENANTS])
    model = _pick(rng, MODELS, [m.weight for m in MODELS])
    agent = rng.choice(AGENTS)
    outcome = _pick(rng, tuple(_OUTCOMES), list(_OUTCOMES.values()))
    plan = RunPlan(tenant=tenant, model=model, agent=agent, outcome=outcome)
    r = rng.random
    plan.turns = min(1 + int(rng.expovariate(1 / 3.5)), 24)
    if outcome == "limit_death":
        plan.detail = rng.choice(LIMIT_AXES)
        if plan.detail == "maxCost" and model.estimated:
            plan.model = MODELS[0]  # cost limits only bite on priced usage
    elif outcome == "provider_error":
        plan.detail = _pick(rng, FAILURE_CLASSES, list(_FAILURE_WEIGHTS))
        plan.turns = rng.randint(0, 3)
    elif outcome == "denied":
        plan.turns = 0 if r() < 0.8 else 1
    elif outcome in ("stale", "fresh"):
        plan.turns = rng.randint(1, 3)
        plan.ends_suspended = r() < 0.25
        plan.limit_pending = outcome == "stale" and not plan.ends_suspended and r() < 0.1
    if outcome in ("success", "host_policy", "turn_limit") and r() < 0.12:
        plan.deterministic = 1  # with turns == 1 the run is answered by middleware alone
    plan.tool_error = r() < 0.05
    plan.retry = r() < 0.06 and plan.turns > 0
    plan.estimate_then_report = not model.estimated and r() < 0.03 and plan.turns > 0
    plan.narrowing = r() < 0.05 and plan.turns > 1
    plan.extension_error = r() < 0.03
    plan.unknown_event = r() < 0.02 and plan.finishes
    plan.suspend_resume = r() < 0.05 and plan.finishes and plan.turns > 1
    if plan.finishes and outcome != "denied" and r() < 0.45:
        plan.run_total = "inconsistent" if r() < 0.05 else "consistent"
    if outcome == "success" and plan.turns >= 2 and "delegate" in agent.tools and r() < 0.15:
        plan.delegation = "milestone" if r() < 0.75 else "failed"
        plan.capped = r() < 0.2
        plan.coalesced = r() < 0.2
    return plan


def _child_plan(rng: random.Random, parent: RunPlan) -> RunPlan:
    model = rng.choice((MODELS[1], MODELS[3], parent.model))
    agent = rng.choice(AGENTS)
    if parent.delegation == "failed":
        axis = rng.choice(("maxTurns", "maxInputTokens"))
        return RunPlan(
            parent.tenant, model, agent, "limit_death", detail=axis, turns=rng.randint(1, 3)
        )
    return RunPlan(
        parent.tenant,
        model,
        agent,
        "success",
        turns=rng.randint(1, 3),
        run_total="consistent" if rng.random() < 0.3 else None,
    )


def _forced() -> list[dict[str, Any]]:
    """Overrides that make every required scenario appear once (runs >= 200)."""
    fixed: list[dict[str, Any]] = [
        dict(
            outcome="success",
            turns=6,
            tool_error=True,
            run_total="consistent",
            suspend_resume=True,
            narrowing=True,
        ),
        dict(outcome="success", turns=4, deterministic=1, run_total="inconsistent"),
        dict(outcome="success", turns=1, deterministic=1),
        dict(outcome="host_policy", turns=3, retry=True),
        dict(outcome="turn_limit", turns=4, estimate_then_report=True, run_total="consistent"),
        dict(outcome="token_limit", turns=2),
        dict(outcome="refusal", turns=2),
        dict(outcome="denied", turns=0),
        dict(outcome="aborted", turns=2),
        dict(outcome="stale", turns=2),
        dict(outcome="stale", turns=2, ends_suspended=True),
        dict(outcome="stale", turns=2, limit_pending=True),
        dict(outcome="fresh", turns=2),
        dict(outcome="fresh", turns=1, ends_suspended=True),
        dict(outcome="success", turns=4, delegation="milestone", capped=True),
        dict(outcome="success", turns=3, delegation="failed", coalesced=True),
        dict(outcome="success", turns=3, unknown_event=True, extension_error=True),
    ]
    fixed += [dict(outcome="limit_death", detail=axis, turns=3) for axis in LIMIT_AXES]
    fixed += [dict(outcome="provider_error", detail=fc, turns=1) for fc in FAILURE_CLASSES]
    return fixed


BURST_AXIS = "maxTurns"


def burst_plans(n: int) -> list[RunPlan]:
    """``n`` one-turn runs of the first tenant that all die on ``maxTurns`` (an alert burst)."""
    return [
        RunPlan(TENANTS[0], MODELS[1], AGENTS[4], "limit_death", detail=BURST_AXIS, turns=1,
                burst=True)
        for _ in range(n)
    ]  # fmt: skip


def draw_plans(rng: random.Random, runs: int) -> list[RunPlan]:
    """Top-level plans for ``runs`` runs in total (a delegating parent's child counts as one).

    A delegating plan carries its child's plan in ``child``.
    """
    plans: list[RunPlan] = []
    forced = _forced() if runs >= COVERAGE_MIN_RUNS else []
    total = 0
    while total < runs:
        i = len(plans)
        plan = _draw(rng)
        if i < len(forced):
            over = forced[i]
            model = MODELS[i % len(MODELS)]
            if over.get("estimate_then_report") or over.get("detail") == "maxCost":
                model = MODELS[i % 3]
            agent = AGENTS[0] if over.get("delegation") else AGENTS[i % len(AGENTS)]
            base = RunPlan(TENANTS[i % len(TENANTS)], model, agent, "success")
            plan = replace(base, **over)
        if plan.delegation and total + 2 <= runs:
            plan.child = _child_plan(rng, plan)
            total += 2
        else:
            plan.delegation = None
            total += 1
        plans.append(plan)
    return plans
