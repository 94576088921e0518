"""Retry transient broker errors at start-up with backoff, up to a deadline, then fail in one line.

A broker that was just started, restarted or is busy answers the first requests with
``NodeNotReadyError``, ``LeaderNotAvailableError``, a metadata request that times out or a
refused connection. Every command and test harness that talks to Kafka when it starts
(creating topics, starting a consumer, reading a consumer group's lag) goes through
``retry_transient`` so such a moment costs a short wait, not a 60-line traceback. Errors
that are not transient (authentication, an unknown topic we raise ourselves, a bug) are
raised at once, unchanged.

Example::

    topics = await retry_transient(
        lambda: list_topics(settings), what="listing topics", bootstrap="127.0.0.1:9092"
    )
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

__all__ = ["DEFAULT_DEADLINE", "BrokerUnavailable", "is_transient", "retry_transient"]

T = TypeVar("T")

DEFAULT_DEADLINE = 60.0
_FIRST_DELAY = 0.25
_MAX_DELAY = 4.0


class BrokerUnavailable(RuntimeError):
    """The broker kept answering with transient errors until the deadline passed."""


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is worth retrying: aiokafka's retriable errors, timeouts, refused sockets."""
    from aiokafka.errors import KafkaError, KafkaTimeoutError, RequestTimedOutError

    if isinstance(exc, KafkaTimeoutError | RequestTimedOutError | TimeoutError):
        return True
    if isinstance(exc, KafkaError):
        return bool(getattr(exc, "retriable", False))
    return isinstance(exc, ConnectionError)


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    name = type(exc).__name__
    return text if text.startswith(name) else f"{name}: {text}" if text else name


class _DropBelowCritical(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.CRITICAL


@contextlib.contextmanager
def _quiet_aiokafka() -> Iterator[None]:
    """aiokafka logs every failed connection at ERROR; the retry speaks for it instead."""
    loggers = [logging.getLogger(n) for n in ("aiokafka", "aiokafka.client", "aiokafka.conn")]
    flt = _DropBelowCritical()
    for lg in loggers:
        lg.addFilter(flt)
    try:
        yield
    finally:
        for lg in loggers:
            lg.removeFilter(flt)


async def retry_transient(
    op: Callable[[], Awaitable[T]],
    *,
    what: str,
    bootstrap: str,
    deadline: float = DEFAULT_DEADLINE,
    first_delay: float = _FIRST_DELAY,
    max_delay: float = _MAX_DELAY,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """Await ``op()``; on a transient error wait (doubling from ``first_delay``) and try again.

    ``op`` must be safe to call again after a failure (e.g. it creates and closes its own
    client). After ``deadline`` seconds the last transient error becomes one
    ``BrokerUnavailable`` line naming ``what``, the broker and the error.
    """
    give_up = clock() + deadline
    delay = first_delay
    attempts = 0
    with _quiet_aiokafka():
        while True:
            attempts += 1
            try:
                return await op()
            except Exception as exc:
                if not is_transient(exc):
                    raise
                left = give_up - clock()
                if left <= 0:
                    reason = _describe(exc)
                    raise BrokerUnavailable(
                        f"{what}: the Kafka broker at {bootstrap} was not ready after "
                        f"{attempts} attempts in {deadline:.0f}s (last error: {reason}); check "
                        "that it runs (prism-pipeline devstack kafka status) and "
                        "PRISM_KAFKA_BOOTSTRAP_SERVERS"
                    ) from None
                await sleep(min(delay, left))
                delay = min(delay * 2, max_delay)
