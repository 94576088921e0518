"""WebhookNotifier against a real HTTP server on 127.0.0.1: exactly one delivery per alert key.

The server fails the first attempt of every key (500, or 429 with Retry-After), so each
key is seen twice on the wire and acknowledged once; the same alerts are handed over twice.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from aiohttp import web

from prism.pipeline.alerting import WebhookNotifier
from prism.sinks.testing import alert_row

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@dataclass
class Hook:
    """A webhook receiver that refuses each key's first attempt."""

    url: str = ""
    attempts: Counter[str] = field(default_factory=Counter)
    accepted: Counter[str] = field(default_factory=Counter)
    bodies: dict[str, dict[str, Any]] = field(default_factory=dict)

    async def handle(self, request: web.Request) -> web.Response:
        key = request.headers["Idempotency-Key"]
        self.attempts[key] += 1
        if self.attempts[key] == 1:
            if key.endswith(":resolved"):
                return web.Response(status=429, headers={"Retry-After": "1"})
            return web.Response(status=500, text="try again")
        if key in self.accepted:  # an idempotent receiver: a repeat is acknowledged, not applied
            return web.Response(status=200)
        self.accepted[key] += 1
        self.bodies[key] = orjson.loads(await request.read())
        return web.Response(status=202)


@pytest.fixture
async def hook() -> AsyncIterator[Hook]:
    receiver = Hook()
    app = web.Application()
    app.router.add_post("/hook", receiver.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    receiver.url = f"http://127.0.0.1:{port}/hook"
    try:
        yield receiver
    finally:
        await runner.cleanup()


async def test_one_delivery_per_alert_key_when_the_first_attempt_fails(hook: Hook) -> None:
    notifier = WebhookNotifier(hook.url, timeout=5, retries=3, backoff=0.05)
    rows = [
        alert_row("run_limit_exhaustion:acme:maxTurns:2026-11-30T10:00:00+00:00"),
        alert_row("stale_run:run-7", rule="stale_run", key="run-7"),
        alert_row(
            "run_limit_exhaustion:acme:maxTurns:2026-11-30T10:00:00+00:00",
            state="resolved",
            version=2,
        ),
    ]
    try:
        await notifier(rows)
        await notifier(rows)  # the same alerts again: no second delivery
        await notifier.drain()
        await notifier(rows[:1])
        await notifier.drain()
    finally:
        await notifier.aclose()

    keys = {f"{r.alert_id}:{r.state}" for r in rows}
    assert hook.accepted == Counter(dict.fromkeys(keys, 1))
    assert hook.attempts == Counter(dict.fromkeys(keys, 2))
    body = hook.bodies["stale_run:run-7:firing"]
    assert (body["alertId"], body["rule"], body["key"]) == ("stale_run:run-7", "stale_run", "run-7")
    assert notifier.stats["delivered"] == 3 and notifier.stats["failed"] == 0
