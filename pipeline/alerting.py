"""Alert delivery to a webhook: one POST per alert state, retried, idempotent, never a storm.

The worker hands every batch of raised or resolved alerts to its alert sinks
(``list[AlertRow]`` -> awaitable). ``WebhookNotifier`` is such a sink: it queues the alerts
and returns at once, so a slow or failing endpoint never holds the stream back; a
background task POSTs each alert as the JSON the ``prism.alerts`` topic carries, with the
header ``Idempotency-Key: <alert_id>:<state>``. Connect errors, timeouts, 5xx and 429 are
retried with exponential backoff (``Retry-After`` honoured); other 4xx are not. Each key is
delivered at most once per window (remembered in bounded memory). Failures are logged and
counted in ``stats``, never raised.

The URL is a secret (webhook URLs carry their token in the path or query): it is kept as a
``SecretStr`` and every log line and error shows it as ``scheme://host/***``.

Errors::

    WebhookConfigError (ValueError)   the URL or a knob is unusable (raised at construction)
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import httpx
from pydantic import SecretStr

from prism.schemas import AlertRow, mask_secrets

from .core import alert_record

__all__ = ["WebhookConfigError", "WebhookNotifier"]

log = logging.getLogger("prism.alerting")

_RETRY_STATUS = frozenset({429, 500, 502, 503, 504}) | frozenset(range(505, 600))


class _MaskUrls(logging.Filter):
    """Masks registered webhook URLs in httpx's request log lines (httpx logs every URL)."""

    def __init__(self) -> None:
        super().__init__("prism-webhook-urls")
        self.urls: dict[str, str] = {}  # real URL -> shown form

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = message
        for real, shown in self.urls.items():
            masked = masked.replace(real, shown)
        if masked != message:
            record.msg, record.args = masked, ()
        return True


_mask_urls = _MaskUrls()
logging.getLogger("httpx").addFilter(_mask_urls)


class WebhookConfigError(ValueError):
    """The webhook URL or a delivery setting is unusable; the message names it."""


class WebhookNotifier:
    """Async alert sink POSTing each alert state once to ``url``.

    ``retries`` is the number of retries after the first attempt; the delay before retry
    ``n`` is ``backoff * 2**n`` seconds (at most ``max_backoff``), or the server's
    ``Retry-After`` when it sends one (also capped). ``window_s``: a key
    ``(alert_id, state)`` delivered once is not delivered again for that long;
    ``max_keys`` bounds the keys remembered. ``client``: an ``httpx.AsyncClient`` to use
    (not closed here); by default one is created on first use and closed by ``aclose``.

    Example::

        notifier = WebhookNotifier("https://hooks.example/prism", retries=5)
        await notifier(alert_rows)   # queues and returns
        await notifier.aclose()      # waits for pending deliveries, closes the client
    """

    def __init__(
        self,
        url: str | SecretStr,
        *,
        timeout: float = 5.0,
        retries: int = 5,
        backoff: float = 0.5,
        window_s: float = 300.0,
        client: httpx.AsyncClient | None = None,
        max_backoff: float = 30.0,
        max_keys: int = 10_000,
        max_pending: int = 1_000,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        from .settings import SecretUrl

        secret = SecretUrl(url.get_secret_value() if isinstance(url, SecretStr) else url)
        try:
            parsed = httpx.URL(secret.get_secret_value())
        except Exception:
            raise WebhookConfigError(
                f"alert webhook URL {str(secret)!r} is not a URL; use "
                "http(s)://host[:port]/path (PRISM_ALERT_WEBHOOK_URL)"
            ) from None
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise WebhookConfigError(
                f"alert webhook URL {str(secret)!r} must be http(s)://host[:port]/path "
                "(PRISM_ALERT_WEBHOOK_URL)"
            )
        if (
            timeout <= 0
            or retries < 0
            or backoff < 0
            or window_s < 0
            or max_keys < 1
            or max_pending < 1
        ):
            raise WebhookConfigError(
                "WebhookNotifier needs timeout > 0, retries >= 0, backoff >= 0, window_s >= 0, "
                f"max_keys >= 1 and max_pending >= 1; got timeout={timeout}, retries={retries}, "
                f"backoff={backoff}, window_s={window_s}, max_keys={max_keys}, "
                f"max_pending={max_pending}"
            )
        self.url = secret  # str(self.url) is scheme://host/***; the POST uses the real one
        for form in (secret.get_secret_value(), str(parsed)):  # as given, as httpx prints it
            _mask_urls.urls[form] = str(secret)
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.window_s = window_s
        self.max_keys = max_keys
        self.max_pending = max_pending
        self.stats: Counter[str] = Counter()
        self._client = client
        self._owns_client = client is None
        self._clock = clock
        self._sleep = sleep
        self._delivered: OrderedDict[str, float] = OrderedDict()  # key -> delivery time
        self._queued: set[str] = set()
        self._queue: asyncio.Queue[AlertRow] | None = None
        self._task: asyncio.Task[None] | None = None

    @staticmethod
    def key_of(row: AlertRow) -> str:
        """The idempotency key of one alert state: ``<alert_id>:<state>``."""
        return f"{row.alert_id}:{row.state}"

    async def __call__(self, alerts: list[AlertRow]) -> None:
        """Queue the alerts not yet delivered in the window; return without waiting."""
        now = self._clock()
        self._forget_expired(now)
        for row in alerts:
            key = self.key_of(row)
            if key in self._queued or key in self._delivered:
                self.stats["suppressed"] += 1
                continue
            queue = self._ensure_running()
            if queue.qsize() >= self.max_pending:
                self.stats["dropped"] += 1
                log.error("alert webhook backlog full (%d pending): dropped %s", queue.qsize(), key)
                continue
            self._queued.add(key)
            queue.put_nowait(row)

    async def drain(self) -> None:
        """Wait until every queued alert was delivered or given up on."""
        if self._queue is not None:
            await self._queue.join()

    async def aclose(self, timeout: float | None = None) -> None:
        """Deliver what is queued (up to ``timeout`` seconds), stop, close an owned client."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.drain(), timeout)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._owns_client and self._client is not None:
            await self._client.aclose()
            self._client = None

    # -- delivery ------------------------------------------------------------------------
    def _ensure_running(self) -> asyncio.Queue[AlertRow]:
        if self._queue is None:
            self._queue = asyncio.Queue()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._run(self._queue), name="prism-alert-webhook"
            )
        return self._queue

    async def _run(self, queue: asyncio.Queue[AlertRow]) -> None:
        while True:
            row = await queue.get()
            key = self.key_of(row)
            try:
                if await self._deliver(row, key):
                    self._remember(key)
            except Exception:  # a notifier must never die: log and go on with the next alert
                self.stats["failed"] += 1
                log.exception("alert webhook delivery of %s failed", key)
            finally:
                self._queued.discard(key)
                queue.task_done()

    async def _deliver(self, row: AlertRow, key: str) -> bool:
        """POST until delivered (True) or given up (False, logged)."""
        client = self._http()
        body = alert_record(row).value
        headers = {
            "Content-Type": "application/json",
            "Idempotency-Key": key,
            "User-Agent": "prism-pipeline-alerts",
        }
        for attempt in range(self.retries + 1):
            delay = None
            try:
                response = await client.post(
                    self.url.get_secret_value(), content=body, headers=headers, timeout=self.timeout
                )
            except httpx.TransportError as exc:  # connect errors, timeouts, broken connections
                reason = self._safe(f"{type(exc).__name__}: {exc}")
            else:
                if response.is_success:
                    self.stats["delivered"] += 1
                    return True
                reason = f"HTTP {response.status_code}"
                if response.status_code not in _RETRY_STATUS:
                    self.stats["failed"] += 1
                    log.error(
                        "alert webhook %s refused %s with %s (not retried): %s",
                        self.url,
                        key,
                        reason,
                        self._safe(response.text[:200]),
                    )
                    return False
                delay = _retry_after(response.headers.get("Retry-After"))
            if attempt == self.retries:
                break
            self.stats["retries"] += 1
            wait = self.backoff * 2**attempt if delay is None else delay
            wait = min(wait, self.max_backoff)
            log.warning(
                "alert webhook delivery of %s failed (%s), retry %d/%d in %.1fs",
                key,
                reason,
                attempt + 1,
                self.retries,
                wait,
            )
            await self._sleep(wait)
        self.stats["failed"] += 1
        log.error(
            "alert webhook delivery of %s to %s failed after %d attempts (%s); the alert "
            "is still on the alerts topic and in the ledger",
            key,
            self.url,
            self.retries + 1,
            reason,
        )
        return False

    def _safe(self, text: str) -> str:
        """``text`` with the URL, its path, query and their parts masked (a server may echo
        them), and anything else secret-looking, for a log line."""
        real = self.url.get_secret_value()
        url = httpx.URL(real)
        path, query = url.path, url.query.decode()
        parts = [p for p in (*path.split("/"), *query.replace("&", "=").split("=")) if len(p) >= 8]
        forms = [real, real.split("?", 1)[0], real.partition("://")[2], url.raw_path.decode()]
        for form in sorted({*forms, path, query, *parts} - {"", "/"}, key=len, reverse=True):
            text = text.replace(form, "***")
        return mask_secrets(text)

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout)
        return self._client

    def _remember(self, key: str) -> None:
        self._delivered[key] = self._clock()
        self._delivered.move_to_end(key)
        while len(self._delivered) > self.max_keys:
            self._delivered.popitem(last=False)

    def _forget_expired(self, now: float) -> None:
        while self._delivered:
            key, at = next(iter(self._delivered.items()))
            if now - at < self.window_s:
                break
            del self._delivered[key]


def _retry_after(value: str | None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())
