"""Where the publisher's drain task sends records: the ``Sink`` protocol and its Kafka form."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from aiokafka import AIOKafkaProducer

from ._base import Record

__all__ = ["KafkaSink", "Sink", "stop_quietly"]

log = logging.getLogger("runtime.publisher")


class Sink(Protocol):
    """Where the drain task sends records (a Kafka producer in production)."""

    async def start(self) -> None:
        """Connect; raise to have the drain task retry with backoff."""

    async def send(self, record: Record) -> asyncio.Future[Any]:
        """Take one record; return a future that settles when it is delivered or fails."""

    async def stop(self) -> None:
        """Deliver what the sink holds (best effort) and disconnect."""


class KafkaSink:
    """A fresh ``AIOKafkaProducer`` per start attempt (a failed start leaves it unusable).

    Each record goes to its own ``topic`` (channel operations), else to the sink's topic.
    """

    def __init__(self, topic: str, producer_kwargs: dict[str, Any]) -> None:
        self._topic = topic
        self._kwargs = producer_kwargs
        self._producer: AIOKafkaProducer | None = None

    async def start(self) -> None:
        producer = AIOKafkaProducer(**self._kwargs)
        try:
            await producer.start()
        except BaseException:
            await asyncio.shield(stop_quietly(producer))
            raise
        self._producer = producer

    async def send(self, record: Record) -> asyncio.Future[Any]:
        assert self._producer is not None, "send() before a successful start()"
        fut: asyncio.Future[Any] = await self._producer.send(
            record.topic or self._topic,
            value=record.value,
            key=record.key,
            headers=list(record.headers),
        )
        return fut

    async def stop(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()


async def stop_quietly(closable: Sink | AIOKafkaProducer) -> None:
    """Stop something that may never have started; log instead of raising."""
    try:
        await closable.stop()
    except Exception as exc:
        log.debug("stopping %r: %s: %s", closable, type(exc).__name__, exc)
