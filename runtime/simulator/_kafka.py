"""Bulk delivery of a simulated fleet to Kafka (aiokafka), paced by a token bucket if asked."""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from aiokafka.partitioner import DefaultPartitioner
from tqdm import tqdm

from .._base import channel_topic_for
from ._config import SimulatorConfigError, SimulatorPublishError
from ._fleet import Fleet

__all__ = ["PublishReport", "publish_to_kafka"]

_MIB = 1_048_576


@dataclass(frozen=True, slots=True)
class PublishReport:
    """What reached the broker: record count, wall seconds, records per partition and topic.

    ``per_partition`` counts the agent-event topic's partitions; ``per_topic`` every topic.
    """

    records: int
    seconds: float
    per_partition: dict[int, int] = field(default_factory=dict)
    per_topic: dict[str, int] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        """Records per second actually achieved."""
        return self.records / self.seconds if self.seconds > 0 else float("inf")


class _TokenBucket:
    """Paces sends to ``rate`` per second with a burst of 50 ms worth of tokens."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.capacity = max(1.0, rate / 20)
        self.tokens = self.capacity
        self.last = time.monotonic()

    async def take(self) -> None:
        while True:
            now = time.monotonic()
            self.tokens = min(self.capacity, self.tokens + (now - self.last) * self.rate)
            self.last = now
            if self.tokens >= 1:
                self.tokens -= 1
                return
            await asyncio.sleep((1 - self.tokens) / self.rate)


async def publish_to_kafka(
    fleet: Fleet,
    bootstrap_servers: str,
    topic: str,
    rate: float | None = None,
    progress: bool = True,
    channel_topic: str | None = None,
    **producer_kwargs: Any,
) -> PublishReport:
    """Produce every record of ``fleet`` (chaos included) to ``topic``, keyed by runId.

    Channel-operation records go to ``channel_topic`` (default: beside ``topic``, e.g.
    ``prism.channel-operations``), keyed by operationId (connectionId for a denial).

    One idempotent producer (``acks=all``) fills 1 MiB batches per partition (keys hash
    like any Kafka producer's) and hands them over with ``send_batch`` without awaiting
    each delivery; ``rate`` caps records per second (a token bucket; batches then leave
    after the 20 ms linger). A tqdm bar shows progress when stderr is a terminal. Extra
    keyword arguments go to ``AIOKafkaProducer``.

    Example::

        await publish_to_kafka(simulate(FleetConfig(runs=1000)), "127.0.0.1:9092",
                               "prism.agent-events", rate=500)
    """
    if rate is not None and not rate > 0:
        raise SimulatorConfigError(f"rate={rate!r} must be > 0 records per second (or None)")
    largest = max((len(r.key) + len(r.value) for r in fleet.records), default=0)
    options: dict[str, Any] = {
        "linger_ms": 20,
        "max_batch_size": _MIB,
        "max_request_size": max(2 * _MIB, largest + 64 * 1024),
        "enable_idempotence": True,
        "acks": "all",
        "request_timeout_ms": 60_000,
    }
    options.update(producer_kwargs)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap_servers, **options)
    where = f"topic {topic!r} at {bootstrap_servers}"
    try:
        await producer.start()
    except KafkaError as exc:
        await producer.stop()
        raise SimulatorPublishError(
            f"cannot connect to Kafka for {where}: {exc}; is the broker up "
            "(prism-pipeline devstack kafka up)?"
        ) from exc
    topics = {"agent": topic, "channel": channel_topic or channel_topic_for(topic)}
    show = progress and sys.stderr.isatty()
    bar = tqdm(total=len(fleet.records), unit="rec", desc=f"-> {topic}", disable=not show)
    started = time.monotonic()
    try:
        shipped = await _send_all(producer, fleet, topics, rate, bar, options["linger_ms"] / 1000)
        results = await asyncio.gather(*(fut for fut, _, _, _ in shipped), return_exceptions=True)
    except KafkaError as exc:
        raise SimulatorPublishError(f"publishing to {where} failed: {exc}") from exc
    finally:
        bar.close()
        await producer.stop()
    failures = [r for r in results if isinstance(r, BaseException)]
    if failures:
        lost = sum(
            n
            for (_, _, _, n), r in zip(shipped, results, strict=True)
            if isinstance(r, BaseException)
        )
        raise SimulatorPublishError(
            f"{lost} of {len(fleet.records)} records were not delivered to {where}; "
            f"first error: {failures[0]!r}"
        )
    per_partition: Counter[int] = Counter()
    per_topic: Counter[str] = Counter()
    for _, to, partition, count in shipped:
        per_topic[to] += count
        if to == topic:
            per_partition[partition] += count
    return PublishReport(
        sum(per_topic.values()),
        time.monotonic() - started,
        dict(sorted(per_partition.items())),
        dict(sorted(per_topic.items())),
    )


async def _send_all(
    producer: AIOKafkaProducer,
    fleet: Fleet,
    topics: dict[str, str],
    rate: float | None,
    bar: tqdm,
    linger: float,
) -> list[tuple[asyncio.Future[Any], str, int, int]]:
    """Fill one batch per (topic, partition) (Kafka's key partitioner) and hand full ones over.

    Returns (delivery future, topic, partition, record count) per batch. With a rate,
    batches older than ``linger`` seconds are sent even when not full.
    """
    partitioner = DefaultPartitioner()
    partitions: dict[str, list[int]] = {}
    for family in sorted({rec.family for rec in fleet.records}):
        partitions[topics[family]] = sorted(await producer.partitions_for(topics[family]))
    partition_of: dict[tuple[str, bytes], int] = {}
    open_batches: dict[tuple[str, int], list[Any]] = {}  # -> [builder, count, created]
    shipped: list[tuple[asyncio.Future[Any], str, int, int]] = []
    bucket = _TokenBucket(rate) if rate else None

    async def ship(where: tuple[str, int]) -> None:
        builder, count, _ = open_batches.pop(where)
        fut = await producer.send_batch(builder, where[0], partition=where[1])
        fut.add_done_callback(lambda _f, n=count: bar.update(n))
        shipped.append((fut, where[0], where[1], count))

    for rec in fleet.records:
        if bucket is not None:
            await bucket.take()
            now = time.monotonic()
            for stale in [w for w, b in open_batches.items() if now - b[2] >= linger]:
                await ship(stale)
        to = topics[rec.family]
        partition = partition_of.get((to, rec.key))
        if partition is None:
            parts = partitions[to]
            partition = partition_of[(to, rec.key)] = partitioner(rec.key, parts, parts)
        where = (to, partition)
        for _ in range(2):
            batch = open_batches.get(where)
            if batch is None:
                batch = open_batches[where] = [producer.create_batch(), 0, time.monotonic()]
            if (
                batch[0].append(
                    key=rec.key, value=rec.value, timestamp=None, headers=list(rec.headers)
                )
                is not None
            ):
                batch[1] += 1
                break
            await ship(where)  # full: the record opens the next batch
    for rest in list(open_batches):
        await ship(rest)
    return shipped
