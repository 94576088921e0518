"""Records the worker produces, and how a set of them goes to one producer in bulk.

``send_records`` hands a set of records to an aiokafka producer (inside the slot's
transaction, ``_checkpoint``) as one record batch per partition, not a send per record,
and waits until the broker has every one; a record without a partition goes where its
key sends it, as the Java client's default partitioner would (murmur2, ``key_partition``).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..core import home_partition

__all__ = ["ProducedRecord", "key_partition", "send_records"]


@dataclass(frozen=True, slots=True)
class ProducedRecord:
    """One record to produce: ``partition`` None lets the key choose (murmur2, as Java)."""

    topic: str
    key: bytes | None
    value: bytes | None
    partition: int | None = None
    headers: tuple[tuple[str, bytes], ...] = ()


def key_partition(key: bytes | None, partitions: Sequence[int]) -> int:
    """The partition of ``partitions`` (sorted) the Java client's default partitioner gives
    ``key``, as aiokafka's ``DefaultPartitioner`` does; a record without a key goes to
    any of them, as there.

    The core's ``home_partition``, compiled with it (``make compile``): 0.13 us a run id,
    where aiokafka's interpreted murmur2 took 8 us, 1.7% of a busy worker's time on the
    interpreter lock (a closed run's record is keyed by its run id; bench/README.md)."""
    if key is None:
        return random.choice(partitions)
    return partitions[home_partition(key, len(partitions))]


def _append(batch: Any, r: ProducedRecord) -> Any:
    return batch.append(timestamp=None, key=r.key, value=r.value, headers=list(r.headers))


async def send_records(
    producer: Any, records: Sequence[ProducedRecord]
) -> dict[tuple[str, int], int]:
    """Hand ``records`` to ``producer`` and wait for the broker's acknowledgement of all.

    One record batch per partition (several when one is full), not a send per record:
    aiokafka's per-record path (a future, the partitioner and the accumulator for each)
    was most of the event loop's work on a busy worker. Inside a transaction each batch's
    partition joins the transaction (aiokafka's accumulator adds it). Returns the offset
    of the last record written to each (topic, partition) (inside a transaction, the
    offsets the records take once it commits).
    """
    partitions: dict[str, list[int]] = {}  # topic -> its partitions, for keyed records
    by_partition: dict[tuple[str, int], list[ProducedRecord]] = {}
    for r in records:
        partition = r.partition
        if partition is None:
            if r.topic not in partitions:
                partitions[r.topic] = sorted(await producer.partitions_for(r.topic))
            partition = key_partition(r.key, partitions[r.topic])
        by_partition.setdefault((r.topic, partition), []).append(r)
    futures, counts = [], []
    for (topic, partition), recs in by_partition.items():
        batch, n = producer.create_batch(), 0
        for r in recs:
            if _append(batch, r) is None:  # full: send it and start the next one
                futures.append(await producer.send_batch(batch, topic, partition=partition))
                counts.append(n)
                batch, n = producer.create_batch(), 0
                _append(batch, r)  # an empty batch takes any record
            n += 1
        futures.append(await producer.send_batch(batch, topic, partition=partition))
        counts.append(n)
    # every future is awaited, so one batch's error leaves none unretrieved (the event
    # loop would log each of those at ERROR); the first error is raised
    results = await asyncio.gather(*futures, return_exceptions=True)
    metas: list[Any] = []
    for result in results:
        if isinstance(result, BaseException):
            raise result
        metas.append(result)
    last: dict[tuple[str, int], int] = {}
    for meta, n in zip(metas, counts, strict=True):
        if meta is not None and meta.offset is not None:  # the batch's base offset
            key = (meta.topic, meta.partition)
            last[key] = max(last.get(key, -1), meta.offset + n - 1)
    return last
