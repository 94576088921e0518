"""WebhookNotifier: retries, Retry-After, idempotency keys, one delivery per key per window.

The HTTP side is httpx's in-process transport (a scripted endpoint); the real-socket case
lives in tests/integration/test_alert_webhook.py.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable

import httpx
import orjson
import pytest

from prism.pipeline.alerting import WebhookConfigError, WebhookNotifier
from prism.sinks.testing import alert_row

pytestmark = pytest.mark.timeout(30)

URL = "http://alerts.invalid/hook"


class Endpoint:
    """A scripted webhook: answers from ``script`` (status or exception per call), then 200."""

    def __init__(self, *script: int | Exception, headers: dict[str, str] | None = None) -> None:
        self.script = list(script)
        self.headers = headers or {}
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        step = self.script.pop(0) if self.script else 200
        if isinstance(step, Exception):
            raise step
        return httpx.Response(step, headers=self.headers if step != 200 else {})

    @property
    def keys(self) -> list[str]:
        return [r.headers["Idempotency-Key"] for r in self.requests]


class Sleeps:
    def __init__(self) -> None:
        self.calls: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


def notifier(
    endpoint: Endpoint,
    sleeps: Sleeps | None = None,
    clock: Callable[[], float] | None = None,
    **kw: object,
) -> WebhookNotifier:
    client = httpx.AsyncClient(transport=httpx.MockTransport(endpoint))
    extra = {"clock": clock} if clock is not None else {}
    return WebhookNotifier(URL, client=client, sleep=sleeps or Sleeps(), **extra, **kw)  # type: ignore[arg-type]


async def test_each_alert_is_posted_as_json_with_its_idempotency_key() -> None:
    endpoint = Endpoint()
    n = notifier(endpoint)
    await n([alert_row("a1"), alert_row("a2", state="resolved", version=2)])
    await n.drain()
    assert endpoint.keys == ["a1:firing", "a2:resolved"]
    body = orjson.loads(endpoint.requests[0].content)
    assert (body["alertId"], body["state"], body["tenantId"]) == ("a1", "firing", "acme")
    assert endpoint.requests[0].headers["Content-Type"] == "application/json"
    assert n.stats["delivered"] == 2


async def test_a_failed_first_attempt_is_retried_with_backoff_and_delivered_once() -> None:
    endpoint, sleeps = Endpoint(500, 503), Sleeps()
    n = notifier(endpoint, sleeps, backoff=0.5)
    await n([alert_row("a1")])
    await n.drain()
    assert endpoint.keys == ["a1:firing"] * 3
    assert sleeps.calls == [0.5, 1.0]
    assert (n.stats["delivered"], n.stats["retries"], n.stats["failed"]) == (1, 2, 0)


async def test_connect_errors_are_retried() -> None:
    endpoint = Endpoint(httpx.ConnectError("refused"), httpx.ReadTimeout("slow"))
    n = notifier(endpoint)
    await n([alert_row("a1")])
    await n.drain()
    assert len(endpoint.requests) == 3
    assert n.stats["delivered"] == 1


async def test_retry_after_is_honoured_on_429() -> None:
    endpoint, sleeps = Endpoint(429, headers={"Retry-After": "7"}), Sleeps()
    n = notifier(endpoint, sleeps, backoff=0.5)
    await n([alert_row("a1")])
    await n.drain()
    assert sleeps.calls == [7.0]
    assert n.stats["delivered"] == 1


async def test_a_client_error_is_not_retried_and_does_not_raise(
    caplog: pytest.LogCaptureFixture,
) -> None:
    endpoint = Endpoint(400)
    n = notifier(endpoint)
    with caplog.at_level(logging.ERROR, logger="prism.alerting"):
        await n([alert_row("a1")])
        await n.drain()
    assert len(endpoint.requests) == 1
    assert n.stats["failed"] == 1
    assert "a1:firing" in caplog.text and "HTTP 400" in caplog.text


async def test_giving_up_after_the_retries_is_logged_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    endpoint = Endpoint(*[httpx.ConnectError("refused")] * 3)
    n = notifier(endpoint, retries=2)
    with caplog.at_level(logging.ERROR, logger="prism.alerting"):
        await n([alert_row("a1")])
        await n.drain()
    assert len(endpoint.requests) == 3
    assert n.stats["failed"] == 1
    assert "failed after 3 attempts" in caplog.text
    # not remembered as delivered: the next time the alert is raised it is tried again
    await n([alert_row("a1")])
    await n.drain()
    assert len(endpoint.requests) == 4


async def test_no_storm_one_delivery_per_key_per_window() -> None:
    now = [1000.0]
    endpoint = Endpoint()
    n = notifier(endpoint, clock=lambda: now[0], window_s=300)
    rows = [alert_row("a1"), alert_row("a1"), alert_row("a1", state="resolved", version=2)]
    await n(rows)
    await n(rows)
    await n.drain()
    await n(rows)
    await n.drain()
    assert Counter(endpoint.keys) == {"a1:firing": 1, "a1:resolved": 1}
    now[0] += 301  # the window has passed: the same key may go out again
    await n([alert_row("a1")])
    await n.drain()
    assert Counter(endpoint.keys) == {"a1:firing": 2, "a1:resolved": 1}


async def test_memory_of_delivered_keys_is_bounded() -> None:
    endpoint = Endpoint()
    n = notifier(endpoint, max_keys=2)
    await n([alert_row(f"a{i}") for i in range(5)])
    await n.drain()
    await n([alert_row("a0"), alert_row("a4")])  # a0 was forgotten, a4 is remembered
    await n.drain()
    assert Counter(endpoint.keys)["a0:firing"] == 2
    assert Counter(endpoint.keys)["a4:firing"] == 1


async def test_a_full_backlog_drops_and_counts() -> None:
    endpoint = Endpoint()
    n = notifier(endpoint, max_pending=2)
    await n([alert_row(f"a{i}") for i in range(4)])
    await n.drain()
    assert len(endpoint.requests) == 2
    assert n.stats["dropped"] == 2


async def test_aclose_delivers_what_is_queued() -> None:
    endpoint = Endpoint()
    n = WebhookNotifier(URL, client=httpx.AsyncClient(transport=httpx.MockTransport(endpoint)))
    await n([alert_row("a1")])
    await n.aclose(timeout=10)
    assert endpoint.keys == ["a1:firing"]


@pytest.mark.parametrize("url", ["ftp://host/x", "not a url", "http:///path"])
def test_an_unusable_url_is_refused_at_construction(url: str) -> None:
    with pytest.raises(WebhookConfigError, match=r"PRISM_ALERT_WEBHOOK_URL|not a URL"):
        WebhookNotifier(url)


def test_bad_knobs_are_refused() -> None:
    with pytest.raises(WebhookConfigError, match="retries=-1"):
        WebhookNotifier(URL, retries=-1)
