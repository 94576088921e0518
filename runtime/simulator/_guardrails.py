"""Guardrail-pack denials (``guardrail_denied``) of simulated runs: which rule denied which step.

Rules follow the built-in packs of Prism 0.9 (migrate-to-0.9 §7), attributed as
``pack:<pack>/<rule>``; a denial never carries the denied content.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from ._scenarios import RunPlan

if TYPE_CHECKING:
    from ._runs import RunGen

__all__ = ["GUARDRAIL_RULES", "deny_at_tool_round", "plan_guardrails"]

# (rule, stage, weight): tool-stage rules dominate; output rules are rarer.
GUARDRAIL_RULES: tuple[tuple[str, str, float], ...] = (
    ("pack:destructive-commands/no-recursive-delete", "before_tool", 4),
    ("pack:destructive-commands/no-force-push", "before_tool", 2),
    ("pack:secrets-hygiene/no-secret-args", "before_tool", 3),
    ("pack:secrets-hygiene/no-secret-in-result", "after_tool", 2),
    ("pack:coding-standard/no-unrelated-file-edits", "before_tool", 2),
    ("pack:coding-standard/no-test-rewrites", "before_tool", 1),
    ("pack:validation-respect/no-skipped-checks", "output", 1),
)


def plan_guardrails(rng: random.Random, plans: list[RunPlan], p: float) -> None:
    """Give runs with a tool round 1-2 planned denials (probability ``p``; at least one run)."""
    eligible = [plan for plan in plans if plan.turns >= 2 and not plan.deterministic]
    chosen = [plan for plan in eligible if rng.random() < p]
    if not chosen and eligible:
        chosen = [rng.choice(eligible)]
    for plan in chosen:
        plan.guardrails = rng.choice((1, 1, 1, 2))


def deny_at_tool_round(g: RunGen, tool: str) -> None:
    """Emit the run's next planned denial at a tool round (the call it denies never runs)."""
    rng = g.rng
    rule, stage, _ = rng.choices(GUARDRAIL_RULES, [w for _, _, w in GUARDRAIL_RULES])[0]
    data: dict[str, object] = {"turn": g.turn, "rule": rule, "stage": stage}
    if stage != "output":
        data["tool"] = tool
    g.b.emit("guardrail_denied", data)
    g.b.advance(1, 40)
    g.guardrails_left -= 1
