"""Event generation for one run (and its delegated child) from a RunPlan."""

from __future__ import annotations

import random
from functools import lru_cache
from typing import Any

from . import _endings, _guardrails
from ._builder import RunBuilder, hex_id, uuid7
from ._catalog import MIDDLEWARE, ModelSpec, digest_of
from ._scenarios import RunPlan
from ._usage import cost_units, estimate_of, run_total_usage, turn_usage

__all__ = ["RunGen", "new_run_id"]

_TOOL_ERRORS = ("TIMEOUT", "NOT_FOUND", "RATE_LIMITED", "INVALID_ARGUMENT", "PERMISSION_DENIED")


def new_run_id(rng: random.Random, ms: int) -> str:
    """A time-ordered run id."""
    return "run_" + uuid7(ms, rng.getrandbits(74)).replace("-", "")


@lru_cache(maxsize=4096)
def _bundle(tenant: str, agent: str, revision: str, provider: str, model: str) -> str:
    return digest_of("bundle/v1", tenant, agent, revision, provider, model)


@lru_cache(maxsize=256)
def _tools_hash(tools: tuple[str, ...]) -> str:
    return digest_of(*sorted(tools))[7:23]


class RunGen:
    """Generates one run's events into a RunBuilder; a delegation generates the child too."""

    def __init__(
        self,
        rng: random.Random,
        plan: RunPlan,
        start_ms: int,
        parent: dict[str, str] | None = None,
    ) -> None:
        self.rng = rng
        self.plan = plan
        m, t, a = plan.model, plan.tenant, plan.agent
        self.run_id = new_run_id(rng, start_ms)
        common: dict[str, Any] = {
            "sessionId": "ses_" + hex_id(rng, 10),
            "tenantId": t.tenant_id,
            "accountId": rng.choice(t.accounts),
            "userId": f"usr-{t.tenant_id.split('-')[0]}-{rng.randrange(t.users):03d}",
            "agent": {"id": a.agent_id, "definitionRevision": a.revision},
            "model": {"provider": m.provider, "model": m.model},
        }
        if parent is not None:
            common["parent"] = parent
        common["bundleDigest"] = _bundle(t.tenant_id, a.agent_id, a.revision, m.provider, m.model)
        self.b = RunBuilder(rng, self.run_id, start_ms, common)
        self.start_ms = start_ms
        self.children: list[RunGen] = []
        self.turn = 0
        self.model_turns = 0
        self.attempts = 0
        self.tool_calls = 0
        self.ctx = rng.randint(1_200, 9_000)
        self.prev_input = 0
        self.run_input = 0
        self.run_output = 0
        self.cost6 = 0
        self.rows: dict[tuple[int, int], dict[str, Any]] = {}
        self.pending: list[dict[str, Any]] = []
        self.budgets: list[dict[str, Any]] = []
        self.tools = [x for x in a.tools if x != "delegate" or plan.delegation]
        self.call_hashes: list[str] = []
        self.guardrails_left = plan.guardrails
        self.limits = self._limits()

    @property
    def model(self) -> ModelSpec:
        return self.plan.model

    @property
    def currency(self) -> str:
        return self.plan.tenant.currency

    def _limits(self) -> dict[str, Any]:
        rng, plan = self.rng, self.plan
        limits: dict[str, Any] = {
            "maxTurns": rng.choice((16, 24, 32)),
            "maxProviderAttempts": 48,
            "maxToolRounds": 32,
            "maxToolCalls": 96,
            "maxWallMs": rng.choice((900_000, 1_800_000)),
            "maxInputTokens": rng.choice((1_000_000, 2_000_000)),
            "maxOutputTokens": 200_000,
            "maxTotalTokens": 2_200_000,
        }
        if not plan.model.estimated and rng.random() < 0.5:
            limits["maxCost"] = {"amount": rng.choice((2, 5, 10)), "currency": self.currency}
        if plan.outcome == "limit_death" and plan.detail == "maxTurns":
            limits["maxTurns"] = max(1, plan.turns)
        if plan.outcome == "limit_death" and plan.detail == "maxCost":
            limits["maxCost"] = {"amount": 0, "currency": self.currency}  # set at the breach
        return limits

    # ---- generation -------------------------------------------------------------------

    def generate(self) -> list[RunGen]:
        """Emit the whole run; return it followed by the child runs it delegated to."""
        self.b.emit("agent_started", {"limits": self.limits, "idempotencyKey": hex_id(self.rng)})
        self.b.advance(5, 120)
        self.finish()
        return [self, *self.children]

    def finish(self) -> None:
        _endings.finish(self)

    def delegate(self) -> None:
        _endings.delegate(self)

    def turns(self, n: int, final_stop: str) -> None:
        """Run ``n`` turns; the last model turn ends with ``final_stop``."""
        rng, plan = self.rng, self.plan
        delegate_at = rng.randrange(n - 1) if plan.child is not None and n > 1 else -1
        det: set[int] = set()
        if plan.deterministic and n:
            spots = [0] if n == 1 else [i for i in range(n - 1) if i != delegate_at]
            if spots:
                det.add(rng.choice(spots))
        model_idx = [i for i in range(n) if i not in det]
        tool_idx = [i for i in model_idx if i != n - 1 or final_stop == "tool_calls"]
        narrow_at = rng.randrange(n) if plan.narrowing and n else -1
        retry_at = rng.choice(model_idx) if plan.retry and model_idx else -1
        late_at = rng.choice(model_idx) if plan.estimate_then_report and model_idx else -1
        error_at = rng.choice(tool_idx) if plan.tool_error and tool_idx else -1
        extras_at = rng.randrange(max(1, n - 1)) if n else -1
        for i in range(n):
            self.flush_pending()
            self.turn += 1
            if i == narrow_at:
                self.narrow()
            if i in det:
                self.b.emit(
                    "deterministic_turn_finished",
                    {"turn": self.turn, "middleware": rng.choice(MIDDLEWARE)},
                )
                self.b.advance(5, 80)
                self.extras(i == extras_at)
                continue
            attempt = 1
            if i == retry_at:
                self.failed_attempt(attempt)
                attempt = 2
            stop = final_stop if i == n - 1 else "tool_calls"
            self.model_turn(stop, attempt, late_report=i == late_at)
            if stop == "tool_calls":
                self.tool_round(force_error=i == error_at)
                if i == delegate_at:
                    self.delegate()
            self.extras(i == extras_at)

    def extras(self, here: bool) -> None:
        if not here:
            return
        rng, plan = self.rng, self.plan
        if plan.suspend_resume:
            self.b.emit("run_suspended", {"reason": "awaiting_approval"})
            self.b.advance(20_000, 360_000)
            self.b.emit("run_resumed", {"reason": "approved"})
            self.b.advance(10, 200)
        if plan.extension_error:
            self.b.emit("extension_error", {"extension": "redactor.pii", "code": "TIMEOUT"})
            self.b.advance(1, 50)
        if plan.unknown_event:
            before = self.ctx
            self.ctx = int(self.ctx * rng.uniform(0.3, 0.6))
            self.b.emit("memory_compacted", {"beforeTokens": before, "afterTokens": self.ctx})
            self.b.advance(50, 900)

    def narrow(self) -> None:
        droppable = [x for x in self.tools if x != "delegate"]
        k = min(len(droppable) - 1, self.rng.randint(1, 2))
        if k < 1:
            return
        dropped = self.rng.sample(droppable, k)
        self.tools = [x for x in self.tools if x not in dropped]
        self.b.emit("tool_narrowing_clamped", {"turn": self.turn, "dropped": dropped})
        self.b.advance(1, 10)

    def _latency(self) -> int:
        lo, hi = self.model.latency_ms
        return int(self.rng.triangular(lo, hi, lo + (hi - lo) * 0.15))

    def _provider_turn(self, stop: str, attempt: int, input_tokens: int) -> dict[str, Any]:
        latency = self._latency()
        self.b.now += latency
        self.attempts += 1
        budgets = {
            "inputTokens": input_tokens,
            "runInputBudget": self.limits["maxInputTokens"],
            "runInputUsed": self.run_input,
            "turns": self.model_turns,
            "maxTurns": self.limits["maxTurns"],
        }
        self.budgets.append(budgets)
        tools = {"count": len(self.tools), "idsHash": _tools_hash(tuple(self.tools))}
        return {
            "turn": self.turn,
            "attempt": attempt,
            "latencyMs": latency,
            "stopReason": stop,
            "budgets": budgets,
            "tools": tools,
        }

    def failed_attempt(self, attempt: int) -> None:
        """A provider attempt that failed: no usage, no cache, stopReason provider_error."""
        data = self._provider_turn("provider_error", attempt, self.ctx)
        self.b.emit("provider_turn_finished", data)
        self.b.advance(200, 3_000)  # backoff

    def model_turn(self, stop: str, attempt: int, late_report: bool = False) -> None:
        rng = self.rng
        inp = self.ctx
        out = 4_096 if stop == "max_output_tokens" else int(rng.triangular(20, 1_500, 180))
        self.model_turns += 1
        self.run_input += inp
        self.run_output += out
        data = self._provider_turn(stop, attempt, inp)
        usage, cache = turn_usage(rng, self.model, self.currency, inp, self.prev_input, out)
        self.prev_input = inp
        self.ctx += out
        if "cost" in usage:
            self.cost6 += cost_units(usage["cost"])
        key = (self.turn, attempt)
        if late_report:
            estimate = estimate_of(rng, usage)
            data["usage"] = estimate
            self.b.emit("provider_turn_finished", data)
            self.b.advance(2, 40)
            self.usage_row(key, estimate)
            self.pending.append({"turn": key[0], "attempt": key[1], "usage": usage})
        else:
            if cache is not None:
                data["cache"] = cache
            data["usage"] = usage
            self.b.emit("provider_turn_finished", data)
            self.b.advance(2, 40)
            self.usage_row(key, usage)

    def usage_row(self, key: tuple[int, int], usage: dict[str, Any]) -> None:
        self.rows[key] = usage
        data = {
            "scope": "provider_turn",
            "turn": key[0],
            "attempt": key[1],
            "entryId": "ule_" + hex_id(self.rng),
            "usage": usage,
        }
        self.b.emit("usage_recorded", data)
        self.b.advance(1, 20)

    def flush_pending(self) -> None:
        """Emit provider reports that arrived after their estimate."""
        for item in self.pending:
            self.b.advance(100, 4_000)
            self.usage_row((item["turn"], item["attempt"]), item["usage"])
        self.pending.clear()

    def run_total(self) -> None:
        self.flush_pending()
        if self.plan.run_total is None or not self.rows:
            return
        usage = run_total_usage(
            self.rng, list(self.rows.values()), self.plan.run_total == "inconsistent"
        )
        self.b.emit(
            "usage_recorded",
            {"scope": "run_total", "entryId": "ule_" + hex_id(self.rng), "usage": usage},
        )
        self.b.advance(1, 20)

    def tool_round(self, force_error: bool = False, tool: str | None = None) -> bool:
        rng = self.rng
        usable = [x for x in self.tools if x != "delegate"] or ["kb.lookup"]
        calls = [tool] if tool else [rng.choice(usable) for _ in range(rng.choice((1, 1, 1, 2, 3)))]
        while self.guardrails_left > 0 and tool is None:
            _guardrails.deny_at_tool_round(self, rng.choice(usable))
        all_ok = True
        for n, name in enumerate(calls):
            duration = int(rng.triangular(15, 4_000, 150))
            self.b.now += duration
            ok = not (force_error and n == 0) and rng.random() > 0.05
            call_hash = hex_id(rng)
            self.call_hashes.append(call_hash)
            self.tool_calls += 1
            data: dict[str, Any] = {
                "turn": self.turn,
                "tool": name,
                "callIdHash": call_hash,
                "durationMs": duration,
                "ok": ok,
            }
            if not ok:
                data["errorCode"] = rng.choice(_TOOL_ERRORS)
                all_ok = False
            self.b.emit("tool_call_finished", data)
            self.ctx += rng.randint(80, 2_500) if ok else rng.randint(20, 120)
            self.b.advance(1, 30)
        return all_ok
