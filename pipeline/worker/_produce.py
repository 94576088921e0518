"""The worker's own producer: output records and run-state changelog writes, in bulk.

faust's producer takes one record per ``await`` through its own buffer and flushes that
buffer before every commit: a few hundred records per batch (closed runs, quarantine,
state of each touched run) cost the worker a quarter of a second per batch and held its
commits back. ``RecordProducer`` hands a batch's records to one aiokafka producer
(idempotent, ``acks=all``, lingering and batching) and waits until the broker has every
one. Transient errors (no leader, timeouts) are retried with backoff, the whole set again:
records are keyed, state writes are idempotent, outputs are at-least-once by contract.

Run state goes straight to the table's changelog topic, partitioned like the source
lane; the changelog is what a worker recovers from (faust replays it into the table's
local store on assignment), so the local store is not written during processing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["ProducedRecord", "RecordProducer"]

log = logging.getLogger("prism.worker")


@dataclass(frozen=True, slots=True)
class ProducedRecord:
    """One record to produce: ``partition`` None lets the key choose (murmur2, as Java)."""

    topic: str
    key: bytes | None
    value: bytes | None
    partition: int | None = None
    headers: tuple[tuple[str, bytes], ...] = ()


class RecordProducer:
    """Produce sets of records and wait for the broker's acknowledgement of each set."""

    def __init__(
        self,
        kafka_kwargs: dict[str, Any],
        *,
        max_request_size: int = 1_048_576,
        attempts: int = 8,
        backoff: float = 0.2,
    ) -> None:
        self._kwargs = kafka_kwargs
        self._max_request_size = max_request_size
        self.attempts = attempts
        self.backoff = backoff
        self._producer: Any = None
        self.sent = 0

    async def _started(self) -> Any:
        if self._producer is None:
            from aiokafka import AIOKafkaProducer

            producer = AIOKafkaProducer(
                acks="all",
                enable_idempotence=True,
                linger_ms=5,
                max_batch_size=1_048_576,
                max_request_size=self._max_request_size,
                **self._kwargs,
            )
            await producer.start()
            self._producer = producer
        return self._producer

    async def send_all(self, records: Sequence[ProducedRecord]) -> None:
        """Produce ``records`` (in order per partition) and wait until the broker has all."""
        if not records:
            return
        from aiokafka.errors import KafkaError

        delay = self.backoff
        for attempt in range(1, self.attempts + 1):
            try:
                producer = await self._started()
                futures = [
                    await producer.send(
                        r.topic, r.value, key=r.key, partition=r.partition,
                        headers=list(r.headers) or None,
                    )
                    for r in records
                ]  # fmt: skip
                await asyncio.gather(*futures)
                self.sent += len(records)
                return
            except KafkaError as exc:
                retriable = getattr(exc, "retriable", False) or type(exc).__name__ in (
                    "KafkaTimeoutError",
                    "KafkaConnectionError",
                    "NotLeaderForPartitionError",
                )
                if not retriable or attempt == self.attempts:
                    raise
                log.warning(
                    "producing %d record(s) failed (%s); attempt %d of %d in %.1fs",
                    len(records), exc, attempt + 1, self.attempts, delay,
                )  # fmt: skip
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def close(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None
