"""Offered load for the freshness benchmark: fleet records re-stamped with ``ts`` = now.

The simulator's wall clock spreads a fleet's event time over the hours before now, so
freshness measured on its records would measure that spread, not the pipeline. Here each
record's ``ts`` is set to the moment it is handed to the producer, and records are sent at
a fixed rate (every ~10 ms, the records then due), keyed by ``runId`` like any producer.
When more records are needed than the fleet holds, the fleet repeats under new run and
event ids, so nothing is a duplicate.

The load shares the machine with the broker and the worker it measures, so it keeps its
own work small: the records it needs are parsed before the clock starts, each send only
re-encodes one, and the partition comes from the core's compiled ``murmur2`` (equal to
aiokafka's partitioner, ``tests/unit/test_core_route.py``). Measured as the process's CPU
time over 10 s of load on a local broker, interleaved: 25.0-30.1% of a core at 10,000
events/s in six runs, against 32.0-34.4% in four with a parse and aiokafka's interpreted
partitioner per record; at 5,000 events/s both took 22-30%, the difference within the
runs' spread. Most of it is aiokafka's producer and the event loop.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

__all__ = ["LoadReport", "offer_load", "restamp"]


@dataclass(frozen=True, slots=True)
class LoadReport:
    """What was offered: records sent, seconds from first to last send, achieved rate."""

    records: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0


def restamp(parsed: dict[str, Any], ts: str, tag: str = "") -> tuple[bytes, bytes]:
    """(key, value) of a parsed record whose ``ts`` is set to ``ts``; ``tag`` suffixes its
    run and event ids (``parsed`` is left as it is).

    Example::

        key, value = restamp(orjson.loads(rec.value), "2026-11-30T12:00:00.000+00:00", "-c1")
    """
    d = dict(parsed, ts=ts)
    if tag:
        d["runId"] = f"{d['runId']}{tag}"
        d["eventId"] = f"{d['eventId']}{tag}"
    return d["runId"].encode(), orjson.dumps(d)


def _now_rfc3339() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


async def offer_load(
    values: Sequence[bytes],
    bootstrap: str,
    topic: str,
    *,
    rate: float,
    count: int,
    first_tag: str = "",
) -> LoadReport:
    """Send ``count`` records built from ``values`` at ``rate`` per second; wait for the acks.

    Record ``i`` is ``values[i % len(values)]`` tagged ``first_tag`` on the first pass and
    ``-c<pass>`` after that.
    """
    from aiokafka import AIOKafkaProducer

    # a topic created a moment ago answers "not leader" until its leaders are elected;
    # the producer retries, so those warnings are noise here
    logging.getLogger("aiokafka").setLevel(logging.ERROR)
    from prism.pipeline.worker._produce import key_partition

    if not values or count <= 0 or rate <= 0:
        raise ValueError(
            f"need values, count > 0 and rate > 0; got {len(values)} values, "
            f"count={count}, rate={rate}"
        )
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        linger_ms=5,
        max_batch_size=256 * 1024,
        max_request_size=4 * 1_048_576,
    )
    await producer.start()
    pending: list[asyncio.Future[Any]] = []
    try:
        partitions = sorted(await producer.partitions_for(topic))
        parsed = [orjson.loads(v) for v in values[: min(count, len(values))]]
        # held through the load: out of the collector's sight, so that no full pass over
        # them comes between a record's stamp and its send
        gc.freeze()
        sent = 0
        start = time.monotonic()
        while sent < count:
            due = min(count, int((time.monotonic() - start) * rate) + 1)
            if due > sent:
                stamp = _now_rfc3339()
                batches: dict[int, Any] = {}
                for i in range(sent, due):
                    n_pass, idx = divmod(i, len(values))
                    key, value = restamp(parsed[idx], stamp, f"-c{n_pass}" if n_pass else first_tag)
                    part = key_partition(key, partitions)
                    batch = batches.get(part)
                    if batch is None:
                        batch = batches[part] = producer.create_batch()
                    if batch.append(key=key, value=value, timestamp=None) is None:
                        pending.append(await producer.send_batch(batch, topic, partition=part))
                        batch = batches[part] = producer.create_batch()
                        batch.append(key=key, value=value, timestamp=None)
                for part, batch in batches.items():
                    pending.append(await producer.send_batch(batch, topic, partition=part))
                sent = due
            await asyncio.sleep(0.01)
        seconds = time.monotonic() - start
        await asyncio.gather(*pending)
    finally:
        gc.unfreeze()
        await producer.stop()
    return LoadReport(sent, seconds)
