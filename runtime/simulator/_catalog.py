"""The simulated world: tenants, agents, models (with their cache and usage habits), prices."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "AGENTS",
    "MIDDLEWARE",
    "MODELS",
    "TENANTS",
    "AgentSpec",
    "ModelSpec",
    "TenantSpec",
    "digest_of",
    "format_cost",
]

CacheHabit = Literal["read_write", "read_only", "read_only_usage", "zeros", "none"]


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A provider/model and how it reports usage and prompt cache.

    ``cache``: ``read_write`` reports cache reads and writes (``data.cache`` and usage),
    ``read_only`` reports reads only, ``read_only_usage`` reads only and only inside usage,
    ``zeros`` reports explicit zeros, ``none`` reports no cache field at all.
    Prices are in hundredths of a currency unit per million tokens.
    """

    provider: str
    model: str
    cache: CacheHabit
    estimated: bool
    confidence: Literal["medium", "low"] | None
    price_in: int
    price_out: int
    price_cache_read: int
    price_cache_write: int
    weight: float
    latency_ms: tuple[int, int]


@dataclass(frozen=True, slots=True)
class TenantSpec:
    """A customer: its billing currency, accounts, users and how much traffic it sends."""

    tenant_id: str
    currency: str
    accounts: tuple[str, ...]
    users: int
    weight: float


@dataclass(frozen=True, slots=True)
class AgentSpec:
    """An agent definition: its tools and its current definition revision."""

    agent_id: str
    revision: str
    tools: tuple[str, ...]


MODELS: tuple[ModelSpec, ...] = (
    ModelSpec(
        "anthropic",
        "claude-sonnet-4-5",
        "read_write",
        False,
        None,
        300,
        1500,
        30,
        375,
        3.0,
        (900, 24_000),
    ),
    ModelSpec(
        "anthropic",
        "claude-haiku-4-5",
        "read_write",
        False,
        None,
        100,
        500,
        10,
        125,
        2.0,
        (400, 9_000),
    ),
    ModelSpec("openai", "gpt-4.1", "read_only", False, None, 200, 800, 50, 0, 2.0, (700, 20_000)),
    ModelSpec(
        "openai", "gpt-4.1-mini", "read_only_usage", False, None, 40, 160, 10, 0, 2.0, (300, 8_000)
    ),
    ModelSpec(
        "google", "gemini-2.5-flash", "zeros", False, None, 30, 250, 8, 0, 1.5, (300, 10_000)
    ),
    ModelSpec(
        "mistral", "mistral-large-2411", "none", False, None, 200, 600, 0, 0, 1.0, (600, 15_000)
    ),
    ModelSpec("ollama", "llama3.3:70b", "none", True, "medium", 0, 0, 0, 0, 1.0, (1_500, 30_000)),
    ModelSpec("edge", "phi-4-mini", "none", True, "low", 0, 0, 0, 0, 0.7, (200, 6_000)),
)

TENANTS: tuple[TenantSpec, ...] = (
    TenantSpec("acme-corp", "USD", ("acct-acme-eng", "acct-acme-support"), 40, 0.30),
    TenantSpec("globex", "USD", ("acct-globex",), 25, 0.22),
    TenantSpec("initech", "USD", ("acct-initech-it", "acct-initech-ops"), 18, 0.18),
    TenantSpec("umbrella-eu", "EUR", ("acct-umbrella-de", "acct-umbrella-fr"), 22, 0.18),
    TenantSpec("hooli", "USD", ("acct-hooli",), 12, 0.12),
)

AGENTS: tuple[AgentSpec, ...] = (
    AgentSpec(
        "support-bot",
        "rev-14",
        ("kb.lookup", "crm.get_ticket", "crm.update_ticket", "email.send", "delegate"),
    ),
    AgentSpec(
        "code-reviewer",
        "rev-7",
        ("repo.read", "repo.diff", "ci.status", "code.run", "fs.write", "shell.exec"),
    ),
    AgentSpec(
        "research-assistant",
        "rev-22",
        ("search.web", "http.fetch", "kb.lookup", "notes.write", "delegate"),
    ),
    AgentSpec(
        "data-analyst",
        "rev-3",
        ("sql.query", "code.run", "chart.render", "fs.read", "fs.write", "delegate"),
    ),
    AgentSpec("triage-router", "rev-9", ("kb.lookup", "crm.get_ticket", "calendar.create")),
)

MIDDLEWARE: tuple[str, ...] = (
    "cache.semantic-hit",
    "router.faq",
    "guard:greeting",
    "policy.handoff-template",
)

_EUR_PER_USD_PERCENT = 92


def digest_of(*parts: str) -> str:
    """A ``sha256:<64 hex>`` digest of the given parts (stable across runs and platforms)."""
    return "sha256:" + hashlib.sha256("\x1f".join(parts).encode()).hexdigest()


def format_cost(
    model: ModelSpec,
    currency: str,
    uncached_in: int,
    cache_read: int,
    cache_write: int,
    output: int,
) -> str:
    """The cost of one provider turn as a decimal string with 6 decimals, in ``currency``."""
    # price [1/100 unit per 1e6 tokens] * tokens = cost in 1e-8 units
    units8 = (
        uncached_in * model.price_in
        + cache_read * model.price_cache_read
        + cache_write * model.price_cache_write
        + output * model.price_out
    )
    if currency == "EUR":
        units8 = units8 * _EUR_PER_USD_PERCENT // 100
    units6 = (units8 + 50) // 100
    return f"{units6 // 1_000_000}.{units6 % 1_000_000:06d}"
