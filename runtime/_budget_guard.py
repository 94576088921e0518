"""``BudgetGuard``: refuse a provider call for a scope whose spend budget is exceeded.

The pipeline's budget desk keeps the compacted topic ``prism.budget-state`` (keyed by
scope id; schemas/CONTRACT.md, "Outputs for runtimes and tracing tools"). The guard reads
it from the beginning, read committed, keeps each scope's latest record and follows the
topic in the background; ``check`` then answers from memory, without I/O, so it can sit
in front of every provider call as the run limits do for one run.

A call is subject to every budget whose scope it falls in: a call of tenant ``acme``,
agent ``bot``, model ``m1`` answers to the budgets of ``tenant=acme``,
``tenant=acme;agent=bot`` and ``tenant=acme;model=m1``. It is refused when one of them is
``exceeded`` (or, with ``use_provisional``, when its provisional spend reached its
amount). A record of a period that has ended refuses nothing (the next period starts at
zero). The guard never blocks or crashes the agent: until it has read the topic, and
while the broker is away, it answers from what it has (allowed, when nothing), and logs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

import orjson

__all__ = ["DEFAULT_BUDGET_TOPIC", "BudgetGuard", "Decision"]

DEFAULT_BUDGET_TOPIC = "prism.budget-state"
_DIMENSIONS = ("tenant", "account", "user", "agent", "model")
_POLL_MS = 500
log = logging.getLogger("prism.runtime.budget_guard")


@dataclass(frozen=True, slots=True)
class Decision:
    """Whether a provider call may start; ``reason`` says why not (or why it may anyway).

    ``scope_id``: the budget that refused it (None when allowed).
    """

    allowed: bool
    reason: str
    scope_id: str | None = None

    def __bool__(self) -> bool:
        return self.allowed


class BudgetGuard:
    """Follows ``prism.budget-state`` and answers ``check`` for a call's scope.

    Example::

        guard = BudgetGuard("127.0.0.1:9092")
        await guard.start()                    # reads the topic to its end, then follows it
        decision = guard.check("acme", agent="support-bot", model="claude-sonnet-4")
        if not decision.allowed:
            raise RuntimeError(decision.reason)  # refuse the provider call, with the reason
        await guard.close()

    ``use_provisional``: refuse on provisional spend too (rows not yet settled). Without a
    broker, ``apply(key, value)`` feeds records directly (a runtime's own tests).
    """

    def __init__(
        self,
        bootstrap_servers: str = "127.0.0.1:9092",
        topic: str = DEFAULT_BUDGET_TOPIC,
        *,
        use_provisional: bool = False,
        **kafka: Any,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.use_provisional = use_provisional
        self.kafka = kafka
        self.states: dict[str, dict[str, Any]] = {}  # scope id -> latest record
        self._caught_up: asyncio.Event | None = None
        self.skipped = 0  # records that were not budget states
        self._consumer: Any = None
        self._task: asyncio.Task[None] | None = None

    # -- following the topic --------------------------------------------------------------
    async def start(self, timeout_s: float = 30.0) -> None:
        """Read the topic to its end (``ready``), then follow it in the background.

        Raises ``TimeoutError`` when the topic cannot be read within ``timeout_s``; the
        guard then still follows it and answers from what it has.
        """
        from aiokafka import AIOKafkaConsumer

        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap_servers,
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
            auto_offset_reset="earliest",
            **self.kafka,
        )
        await self._consumer.start()
        caught_up = self._caught_up = asyncio.Event()

        async def follow() -> None:
            consumer = self._consumer
            while True:  # subscribe only to a topic that exists (never auto-create it)
                try:
                    if self.topic in await consumer.topics():
                        break
                    caught_up.set()  # no such topic yet: no budget is exceeded
                except Exception:  # the broker is away: answer from memory, try again
                    log.warning("budget guard: no metadata for %s", self.topic, exc_info=True)
                await asyncio.sleep(1.0)
            consumer.subscribe([self.topic])  # no group: every partition, from the start
            ends: dict[Any, int] = {}
            while True:
                try:
                    batch = await consumer.getmany(timeout_ms=_POLL_MS)
                    for records in batch.values():
                        for rec in records:
                            self.apply(rec.key, rec.value)
                    tps = sorted(consumer.assignment())
                    if caught_up.is_set() or not tps:
                        continue
                    ends = ends or await consumer.end_offsets(tps)
                    positions = [await consumer.position(tp) for tp in tps]
                    if all(pos >= ends.get(tp, 0) for pos, tp in zip(positions, tps, strict=True)):
                        caught_up.set()
                except asyncio.CancelledError:
                    raise
                except Exception:  # the broker went away: answer from memory, try again
                    log.warning("budget guard: reading %s failed", self.topic, exc_info=True)
                    await asyncio.sleep(1.0)

        self._task = asyncio.create_task(follow(), name="prism-budget-guard")
        await asyncio.wait_for(caught_up.wait(), timeout_s)

    @property
    def ready(self) -> bool:
        """Whether the topic was read to its end once (``check`` answers from all of it)."""
        return self._caught_up is not None and self._caught_up.is_set()

    async def close(self) -> None:
        """Stop following the topic (the states read so far stay)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            with contextlib.suppress(Exception):
                await consumer.stop()

    def apply(self, key: bytes | None, value: bytes | None) -> None:
        """One record of the topic: a scope's latest state, or a tombstone (None)."""
        if key is None:
            self.skipped += 1
            return
        scope_id = key.decode("utf-8", "replace")
        if value is None:
            self.states.pop(scope_id, None)
            return
        try:
            state = orjson.loads(value)
            if not isinstance(state, dict) or not isinstance(state.get("scope"), dict):
                raise ValueError("no scope")
            _money(state, "amount")
        except (ValueError, TypeError, KeyError):
            self.skipped += 1
            log.warning("budget guard: skipped a record of %s that is no budget state", scope_id)
            return
        self.states[scope_id] = state

    # -- deciding -------------------------------------------------------------------------
    def check(
        self,
        tenant: str,
        *,
        account: str | None = None,
        user: str | None = None,
        agent: str | None = None,
        model: str | None = None,
        now: datetime | None = None,
    ) -> Decision:
        """Whether a provider call of this scope may start now."""
        call = {"tenant": tenant, "account": account, "user": user, "agent": agent, "model": model}
        when = now or datetime.now(UTC)
        watched = 0
        for scope_id in sorted(self.states):
            state = self.states[scope_id]
            scope = state["scope"]
            if any(call.get(d) != v for d, v in scope.items() if d in _DIMENSIONS):
                continue
            if any(d not in _DIMENSIONS for d in scope):
                continue  # a dimension this guard does not know: cannot be judged
            if _ended(state, when):
                continue
            watched += 1
            refused = self._refusal(scope_id, state)
            if refused is not None:
                return refused
        if not self.ready and not self.states:
            return Decision(True, "budget state not read yet: allowed")
        return Decision(True, f"within budget ({watched} budget(s) apply)")

    def _refusal(self, scope_id: str, state: dict[str, Any]) -> Decision | None:
        amount, currency = _money(state, "amount"), state.get("currency", "")
        period = state.get("period") or {}
        span = f"{period.get('start')}..{period.get('end')}"
        if state.get("state") == "exceeded":
            spent = _money(state, "spent")
            return Decision(
                False,
                f"budget {scope_id} exceeded: spent {spent} of {amount} {currency} in the "
                f"period {span} (settled as of {state.get('asOf')})",
                scope_id,
            )
        if self.use_provisional:
            provisional = _money(state, "provisional")
            if provisional >= amount:
                return Decision(
                    False,
                    f"budget {scope_id} exceeded by provisional spend: {provisional} of "
                    f"{amount} {currency} in the period {span} (not yet settled)",
                    scope_id,
                )
        return None


def _money(state: dict[str, Any], name: str) -> Decimal:
    try:
        return Decimal(str(state.get(name, "0")))
    except InvalidOperation:
        raise ValueError(f"{name} is not a decimal") from None


def _ended(state: dict[str, Any], now: datetime) -> bool:
    try:
        end = datetime.fromisoformat(state["period"]["end"])
    except (KeyError, TypeError, ValueError):
        return False
    return end <= now
