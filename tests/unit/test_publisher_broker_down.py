"""With the broker down, ``EventPublisher.publish()`` never blocks the event loop; policies apply.

The publisher points at a free port with nothing listening. A ticker coroutine runs next to
the "agent": a publish that blocked the loop, or that waited for the broker, would show up
as ticks happening inside the publish call, or as the ticker not advancing while the agent
yields.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest

from prism.devstack import free_port
from prism.runtime import EventPublisher, FullPolicy

pytestmark = pytest.mark.timeout(60)


class Ticker:
    """Counts event-loop turns it gets while running."""

    def __init__(self) -> None:
        self.ticks = 0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            self.ticks += 1
            await asyncio.sleep(0)

    def __enter__(self) -> Ticker:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


def down_publisher(policy: FullPolicy, size: int, deadline: float = 1.0) -> EventPublisher:
    return EventPublisher(
        f"127.0.0.1:{free_port()}", topic="prism.agent-events", buffer_size=size,
        full_policy=policy, deadline=deadline, start_backoff=(0.01, 0.05),
        request_timeout_ms=2000,
    )  # fmt: skip


async def wait_for(predicate: Callable[[], bool], what: str) -> None:
    for _ in range(2000):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"gave up waiting for {what}")


async def test_drop_policy_publish_returns_within_its_own_loop_turn(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.CRITICAL, logger="aiokafka")
    pub = down_publisher("drop", size=50)
    run = pub.run("run-1", tenant_id="acme")
    with Ticker() as ticker:
        for i in range(1000):
            before = ticker.ticks
            result = run.emit("tool_call_finished", {"turn": 1, "tool": "search",
                                                     "callIdHash": f"c{i}", "durationMs": 2,
                                                     "ok": True})  # fmt: skip
            assert await result is (i < 50)
            assert ticker.ticks == before  # publish (and its await) never gave up the loop
            await asyncio.sleep(0)  # the agent's own work
        assert ticker.ticks >= 1000  # and the loop kept serving other coroutines
        await wait_for(lambda: pub.stats.start_attempts >= 3, "connection retries")
    stats = pub.stats
    assert (stats.published, stats.dropped_full, stats.buffered) == (50, 950, 50)
    assert (stats.delivered, stats.delivery_failed) == (0, 0)
    assert await pub.close(timeout=0.2) is False
    assert (pub.stats.dropped_on_close, pub.stats.buffered) == (50, 0)


async def test_wait_policy_waits_without_blocking_then_drops_at_the_deadline(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.CRITICAL, logger="aiokafka")
    pub = down_publisher("wait", size=5, deadline=0.2)
    run = pub.run("run-1")
    with Ticker() as ticker:
        for _ in range(5):
            assert run.emit("agent_started", {}).accepted is True
        before = ticker.ticks
        parked = [run.emit("agent_started", {}) for _ in range(3)]
        assert ticker.ticks == before  # the call itself returned at once
        assert [r.accepted for r in parked] == [None, None, None]
        assert pub.stats.waiting == 3
        assert await asyncio.gather(*parked) == [False, False, False]
        assert ticker.ticks > before  # the loop ran on while they waited
    stats = pub.stats
    assert (stats.published, stats.dropped_full, stats.waiting) == (5, 3, 0)
    assert stats.start_attempts >= 1 and stats.delivered == 0
    await pub.close(timeout=0.2)
    assert pub.stats.dropped_on_close == 5


async def test_close_with_the_broker_down_does_not_hang(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.CRITICAL, logger="aiokafka")
    pub = down_publisher("drop", size=10)
    pub.run("run-1").emit("agent_started", {})
    await wait_for(lambda: pub.stats.start_attempts >= 1, "a connection attempt")
    assert await pub.close(timeout=0.1) is False
    assert pub.stats.dropped_on_close == 1
