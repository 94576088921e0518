"""Slot state read back to its end, read committed: what a new owner of a slot loads.

The worker writes each slot's state (its runs and channel operations, and the slot's
position record, ``_slotstate``) as keyed records to the compacted
``<group>-run-state-changelog`` topic, partition ``p`` for slot ``p``, inside the slot's
transaction (``_checkpoint``); the alerter's state goes to ``<group>-alert-state-changelog``
the same way. A process assigned a slot whose state it does not hold reads that partition
with a group-less, read-committed consumer from its first offset to the end offset taken
at that moment (``StateReader.read``; the last write of a key wins, an empty value deletes
it): only committed transactions count, and the read ends, whatever else moves. Its time
is bounded by the topic's compaction (``topics.COMPACTED``): SCALING.md, "Rebalances".
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection
from typing import Any

from ..retry import retry_transient

__all__ = ["StateReader", "stop_quietly"]

log = logging.getLogger("prism.worker")

_POLL_MS = 500
_FETCH_BYTES = 16 * 1024 * 1024  # per partition and fetch (aiokafka's default is 1 MiB)


class StateReader:
    """Reads whole partitions of one state topic (see the module docstring)."""

    def __init__(self, topic: str, consumer_kwargs: dict[str, Any], *, timeout_s: float = 120.0):
        self.topic = topic
        self.kwargs = consumer_kwargs
        self.timeout_s = timeout_s
        self._consumer: Any = None
        self.last_read: tuple[int, int, float] = (0, 0, 0.0)  # (partitions, records, seconds)

    async def read(self, partition: int) -> dict[bytes, bytes]:
        """Every live key of ``partition`` and its last value, as of the end offset now."""
        return (await self.read_many([partition]))[partition]

    async def read_many(self, partitions: Collection[int]) -> dict[int, dict[bytes, bytes]]:
        """``read`` of several partitions in one assignment (a rebalance hands a worker
        several at once: one re-assignment of the reader, not one per partition)."""
        wanted = sorted(set(partitions))
        if not wanted:
            return {}
        return await retry_transient(
            lambda: self._read(wanted),
            what=f"reading the state of {self.topic}{wanted}",
            bootstrap=str(self.kwargs.get("bootstrap_servers", "")),
            deadline=self.timeout_s,
        )

    async def _read(self, partitions: list[int]) -> dict[int, dict[bytes, bytes]]:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        started = time.monotonic()
        tps = {TopicPartition(self.topic, p): p for p in partitions}
        states: dict[int, dict[bytes, bytes]] = {p: {} for p in partitions}
        count = 0
        try:
            if self._consumer is None:
                self._consumer = AIOKafkaConsumer(
                    group_id=None,
                    enable_auto_commit=False,
                    isolation_level="read_committed",
                    max_partition_fetch_bytes=_FETCH_BYTES,  # whole partitions: big fetches
                    fetch_max_bytes=4 * _FETCH_BYTES,
                    **self.kwargs,
                )
                await self._consumer.start()
            consumer = self._consumer
            consumer.assign(list(tps))
            starts = await consumer.beginning_offsets(list(tps))
            ends = await consumer.end_offsets(list(tps))
            left = {tp for tp in tps if ends[tp] > starts[tp]}
            for tp in left:
                consumer.seek(tp, starts[tp])
            while left:
                batch = await consumer.getmany(*left, timeout_ms=_POLL_MS)
                for tp, records in batch.items():
                    state = states[tps[tp]]
                    for rec in records:
                        if rec.offset >= ends[tp]:
                            break
                        count += 1
                        if rec.value is None:  # a tombstone: the key was deleted
                            state.pop(rec.key, None)
                        else:
                            state[rec.key] = rec.value
                for tp in list(left):
                    if await consumer.position(tp) >= ends[tp]:
                        left.discard(tp)
            # unassigned between reads: its fetcher would otherwise hold a fetch of each
            # partition past the end (up to _FETCH_BYTES each) until the next read
            consumer.unsubscribe()
        except asyncio.CancelledError:
            raise
        except Exception:  # a broken connection: a new consumer on the next try
            await self.close()
            raise
        self.last_read = (len(partitions), count, time.monotonic() - started)
        return states

    async def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        await stop_quietly(consumer, "state reader")


async def stop_quietly(consumer: Any, what: str) -> None:
    """Stop a group-less consumer, if there is one; a failure to stop is only logged."""
    if consumer is not None:
        try:
            await consumer.stop()
        except Exception:  # closing after a broker error: nothing more to do
            log.debug("%s did not stop cleanly", what, exc_info=True)
