"""``BudgetGuard`` against the real broker: it follows the compacted budget-state topic,
read committed, and refuses a provider call for a scope whose budget is exceeded."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from prism.runtime import BudgetGuard

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)


def state(scope: dict[str, str], status: str, spent: str, provisional: str) -> bytes:
    """A record as the desk writes it (schemas/CONTRACT.md, "Outputs for runtimes")."""
    return orjson.dumps(
        {
            "scope": scope,
            "currency": "USD",
            "period": {"start": "2026-11-01T00:00:00+01:00", "end": "2026-12-01T00:00:00+01:00"},
            "amount": "100",
            "spent": spent,
            "provisional": provisional,
            "estimatedAtRisk": {"rows": 0, "inputTokens": 0, "outputTokens": 0},
            "unconverted": {},
            "state": status,
            "thresholdsCrossed": ["100%"] if status == "exceeded" else [],
            "asOf": "2026-11-20T11:59:00+00:00",
        }
    )


async def eventually(check: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "the guard never saw the record"
        await asyncio.sleep(0.1)


async def test_the_guard_refuses_an_exceeded_scope_and_follows_the_topic(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    topic = f"{topic_prefix}.budget-state"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic(topic, 1, 1, topic_configs={"cleanup.policy": "compact"})]
        )
    finally:
        await admin.close()
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka_bootstrap, transactional_id=f"{topic_prefix}-desk"
    )
    await producer.start()

    async def send(key: str, value: bytes | None, *, commit: bool = True) -> None:
        async with producer.transaction() if commit else _aborted(producer):
            await producer.send_and_wait(topic, value, key=key.encode())

    guard = BudgetGuard(kafka_bootstrap, topic)
    try:
        # written before the guard starts: read on start, before it says it is ready
        await send("tenant=acme", state({"tenant": "acme"}, "exceeded", "104.5", "110"))
        await send(
            "tenant=acme;agent=bot", state({"tenant": "acme", "agent": "bot"}, "ok", "3", "3")
        )
        await send("tenant=globex", state({"tenant": "globex"}, "warning", "90", "120"))
        await guard.start(timeout_s=30)
        assert guard.ready

        refused = guard.check("acme", agent="bot", model="m1", now=NOW)
        assert (refused.allowed, refused.scope_id) == (False, "tenant=acme")
        assert refused.reason == (
            "budget tenant=acme exceeded: spent 104.5 of 100 USD in the period "
            "2026-11-01T00:00:00+01:00..2026-12-01T00:00:00+01:00 (settled as of "
            "2026-11-20T11:59:00+00:00)"
        )
        assert guard.check("globex", now=NOW).allowed  # warning: settled spend within budget
        assert guard.check("initech", now=NOW).allowed  # no budget
        assert guard.check("acme", now=datetime(2026, 12, 1, tzinfo=UTC)).allowed  # period over

        # an aborted transaction's record is never seen (read committed)
        await send(
            "tenant=globex", state({"tenant": "globex"}, "exceeded", "150", "150"), commit=False
        )
        await send("tenant=initech", state({"tenant": "initech"}, "exceeded", "101", "101"))
        await eventually(lambda: "tenant=initech" in guard.states)
        assert guard.check("globex", now=NOW).allowed

        # the latest record of a scope wins; a tombstone removes the budget
        await send("tenant=acme", state({"tenant": "acme"}, "ok", "20", "20"))
        await eventually(lambda: guard.states["tenant=acme"]["spent"] == "20")
        assert guard.check("acme", agent="bot", now=NOW).allowed
        await send("tenant=initech", None)
        await eventually(lambda: "tenant=initech" not in guard.states)
        assert guard.check("initech", now=NOW).allowed
    finally:
        await guard.close()
        await producer.stop()

    # a guard that opts in to provisional spend refuses globex (120 of 100, not settled)
    strict = BudgetGuard(kafka_bootstrap, topic, use_provisional=True)
    try:
        await strict.start(timeout_s=30)
        decision = strict.check("globex", now=NOW)
        assert (decision.allowed, decision.scope_id) == (False, "tenant=globex")
        assert "provisional spend: 120 of 100 USD" in decision.reason
    finally:
        await strict.close()


class _aborted:  # used like producer.transaction()
    """A transaction that is aborted instead of committed."""

    def __init__(self, producer: AIOKafkaProducer) -> None:
        self.producer = producer

    async def __aenter__(self) -> None:
        await self.producer.begin_transaction()

    async def __aexit__(self, *exc: Any) -> None:
        await self.producer.abort_transaction()
