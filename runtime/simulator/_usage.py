"""Token, prompt-cache and cost figures of simulated provider turns, as the vendors report them."""

from __future__ import annotations

import random
from typing import Any

from ._catalog import ModelSpec, format_cost

__all__ = ["cost_units", "estimate_of", "run_total_usage", "turn_usage"]


def cost_units(cost: str) -> int:
    """A 6-decimal cost string as an integer count of 1e-6 currency units."""
    whole, _, frac = cost.partition(".")
    return int(whole) * 1_000_000 + int(frac.ljust(6, "0")[:6])


def _format_units(units: int) -> str:
    return f"{units // 1_000_000}.{units % 1_000_000:06d}"


def turn_usage(
    rng: random.Random,
    model: ModelSpec,
    currency: str,
    input_tokens: int,
    prev_input: int,
    output_tokens: int,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """One turn's usage row and ``data.cache`` block (None when the model reports no block).

    Usage-less vendors get an estimate (``estimated``, ``confidence``, never a price).
    """
    if model.estimated:
        return _estimated(model.confidence or "low", input_tokens, output_tokens), None
    read = write = 0
    habit = model.cache
    if habit in ("read_write", "read_only", "read_only_usage"):
        if prev_input:
            read = int(prev_input * rng.uniform(0.6, 0.98))
        elif rng.random() < 0.5:
            read = int(input_tokens * rng.uniform(0.3, 0.7))  # warm system-prompt prefix
        if habit != "read_write":
            read = read // 128 * 128 if input_tokens >= 1024 else 0
        read = min(read, input_tokens)
        if habit == "read_write":
            write = max(0, input_tokens - read - rng.randint(0, 400))
    uncached = input_tokens - read - write
    usage: dict[str, Any] = {
        "inputTokens": input_tokens,
        "outputTokens": output_tokens,
        "totalTokens": input_tokens + output_tokens,
    }
    cache: dict[str, Any] | None = None
    if habit == "read_write" or habit == "zeros":
        usage["cacheReadTokens"] = read
        usage["cacheWriteTokens"] = write
        cache = {"cacheReadTokens": read, "cacheWriteTokens": write}
    elif habit in ("read_only", "read_only_usage"):
        usage["cacheReadTokens"] = read
        if habit == "read_only":
            cache = {"cacheReadTokens": read}
    if cache is not None and input_tokens:
        cache["hitRate"] = round(read / input_tokens, 4)
    usage["cost"] = format_cost(model, currency, uncached, read, write, output_tokens)
    usage["currency"] = currency
    return usage, cache


def _estimated(confidence: str, inp: int, out: int) -> dict[str, Any]:
    return {
        "inputTokens": inp,
        "outputTokens": out,
        "totalTokens": inp + out,
        "estimated": True,
        "confidence": confidence,
    }


def estimate_of(rng: random.Random, reported: dict[str, Any]) -> dict[str, Any]:
    """A medium-confidence estimate made before the provider's report for the same turn."""
    inp = max(1, int(reported["inputTokens"] * rng.uniform(0.85, 1.15)))
    out = max(1, int(reported["outputTokens"] * rng.uniform(0.7, 1.3)))
    return _estimated("medium", inp, out)


def run_total_usage(
    rng: random.Random, rows: list[dict[str, Any]], inconsistent: bool
) -> dict[str, Any]:
    """The run's aggregate usage over its effective provider-turn rows (optionally off)."""
    total: dict[str, Any] = {}
    for name in (
        "inputTokens",
        "outputTokens",
        "totalTokens",
        "cacheReadTokens",
        "cacheWriteTokens",
    ):
        if any(name in row for row in rows):
            total[name] = sum(int(row.get(name, 0)) for row in rows)
    priced = [row for row in rows if "cost" in row]
    if priced:
        total["cost"] = _format_units(sum(cost_units(row["cost"]) for row in priced))
        total["currency"] = priced[0]["currency"]
    if any(row.get("estimated") for row in rows):
        # The aggregate is as uncertain as its least certain part; never priced.
        total.pop("cost", None)
        total.pop("currency", None)
        total["estimated"] = True
        levels = {row.get("confidence") for row in rows}
        total["confidence"] = "low" if "low" in levels else "medium"
    if inconsistent:
        delta = rng.randint(1, 2000)
        total["inputTokens"] = total.get("inputTokens", 0) + delta
        total["totalTokens"] = total.get("totalTokens", 0) + delta
    return total
