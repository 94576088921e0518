"""The worker's own producer: output records and run-state changelog writes, in bulk.

faust's producer takes one record per ``await`` through its own buffer and flushes that
buffer before every commit: a few hundred records per batch (closed runs, quarantine,
state of each touched run) cost the worker a quarter of a second per batch and held its
commits back. ``RecordProducer`` hands a batch's records to one aiokafka producer
(idempotent, ``acks=all``, lingering and batching) and waits until the broker has every
one. Transient errors (no leader, timeouts) are retried with backoff like every other
broker call (``retry.retry_transient``), the whole set again: records are keyed, state
writes are idempotent, outputs are at-least-once by contract.

Run state goes to the run-state changelog topic, partitioned like the source lane; the
changelog is what the next owner of the partition reads back to its end on assignment
(``_state.StateReader``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka.partitioner import DefaultPartitioner

from ..retry import DEFAULT_DEADLINE, retry_transient

__all__ = ["ProducedRecord", "RecordProducer"]


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
        deadline: float = DEFAULT_DEADLINE,
    ) -> None:
        self._kwargs = kafka_kwargs
        self._max_request_size = max_request_size
        self.deadline = deadline
        self._producer: Any = None
        self._partitioner = DefaultPartitioner()

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
        """Produce ``records`` (in order per partition) and wait until the broker has all;
        transient errors are retried (``retry.retry_transient``), the whole set again."""
        if records:
            await retry_transient(
                lambda: self._send(records),
                what=f"producing {len(records)} output and state record(s)",
                bootstrap=str(self._kwargs.get("bootstrap_servers")),
                deadline=self.deadline,
            )

    async def _send(self, records: Sequence[ProducedRecord]) -> None:
        """One record batch per partition (several when one is full), not a send per record:
        aiokafka's per-record path (a future, the partitioner and the accumulator for
        each) was most of the event loop's work on a busy worker."""
        producer = await self._started()
        partitions: dict[str, list[int]] = {}  # topic -> its partitions, for keyed records
        by_partition: dict[tuple[str, int], list[ProducedRecord]] = {}
        for r in records:
            partition = r.partition
            if partition is None:
                if r.topic not in partitions:
                    partitions[r.topic] = sorted(await producer.partitions_for(r.topic))
                partition = int(self._partitioner(r.key, partitions[r.topic], partitions[r.topic]))
            by_partition.setdefault((r.topic, partition), []).append(r)
        futures = []
        for (topic, partition), recs in by_partition.items():
            batch = producer.create_batch()
            for r in recs:
                if _append(batch, r) is None:  # full: send it and start the next one
                    futures.append(await producer.send_batch(batch, topic, partition=partition))
                    batch = producer.create_batch()
                    _append(batch, r)  # an empty batch takes any record
            futures.append(await producer.send_batch(batch, topic, partition=partition))
        await asyncio.gather(*futures)

    async def close(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None


def _append(batch: Any, r: ProducedRecord) -> Any:
    return batch.append(timestamp=None, key=r.key, value=r.value, headers=list(r.headers))
