"""Slots read ahead before the group hands them over: a joining member's warm-up.

A slot that moves stands still while its new owner reads its state partition back (a
soak's restores took 1-8 s under load, 23 s once), and a member that joins and leaves
again moved each slot twice. So the assignor (``_assignor.defer_cold``) does not hand a
*cold* member (one holding nothing, with nothing read ahead) the slots other members hold:
it leaves them where they are and names them as the member's warm-ups. ``Standby`` reads
those slots' state partitions ahead, beside the work (its own reader: a restore may run at
the same time), keeps them as snapshots, and then rejoins the group reporting them warm
(``GroupConsumer.warmed``); the next assignment moves them, and the restore reads only
what was written since the snapshot (``StateReader.read_snapshots``). This is Kafka
Streams' warm-up replica and probing rebalance (KIP-441), with the read-ahead kept in
memory until the hand-over.

A read-ahead that fails is logged and reported warm all the same: the slots are then
restored in full when handed over, as before, and the member does not stay cold for
good. Rejoins are at least ``min_interval_s`` apart, so a member whose report does not
reach the assignor cannot rebalance the group in a loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Collection

from aiokafka import TopicPartition

from ._consumer import GroupConsumer
from ._state import Snapshot, StateReader

__all__ = ["Standby"]

log = logging.getLogger("prism.worker")


class Standby:
    """The warm-ups of the last assignment and their snapshots (see the module docstring)."""

    def __init__(
        self,
        reader: StateReader,
        consumer: GroupConsumer,
        slot_topics: Collection[str],
        *,
        min_interval_s: float = 10.0,
    ) -> None:
        self.reader = reader
        self.consumer = consumer
        self.slot_topics = frozenset(slot_topics)
        self.min_interval_s = min_interval_s
        self.snapshots: dict[int, Snapshot] = {}
        self.wanted: frozenset[TopicPartition] = frozenset()
        self.warmups: list[float] = []  # seconds each read-ahead took, to the rejoin
        self._task: asyncio.Future[None] | None = None
        self._rejoined_at = float("-inf")

    def want(self, tps: Collection[TopicPartition]) -> None:
        """Read ahead ``tps`` (the last assignment's warm-ups), then rejoin; a call with
        the warm-ups already in hand changes nothing, an empty one drops them all."""
        wanted = frozenset(tps)
        if wanted == self.wanted and self._task is not None:
            return
        self._cancel()
        self.wanted = wanted
        slots = {tp.partition for tp in wanted if tp.topic in self.slot_topics}
        self.snapshots = {p: s for p, s in self.snapshots.items() if p in slots}
        if wanted:
            self._task = asyncio.ensure_future(self._warm(wanted, slots))

    def take(self, partition: int) -> Snapshot | None:
        """Slot ``partition``'s snapshot, handed to its restore (and forgotten here)."""
        return self.snapshots.pop(partition, None)

    async def _warm(self, tps: frozenset[TopicPartition], slots: set[int]) -> None:
        started = time.monotonic()
        missing = sorted(slots - set(self.snapshots))
        try:
            self.snapshots.update(await self.reader.read_snapshots(missing))
            _, records, took = self.reader.last_read
            log.info("read slots %s ahead: %d state records in %.1fs", missing, records, took)
        except asyncio.CancelledError:
            raise
        except Exception:  # restored in full when handed over, as without a read-ahead
            log.warning("reading slots %s ahead failed; rejoining all the same", missing,
                        exc_info=True)  # fmt: skip
        wait = self._rejoined_at + self.min_interval_s - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        self._rejoined_at = time.monotonic()
        self.warmups.append(self._rejoined_at - started)
        self.consumer.warmed(tps, rejoin=True)

    def _cancel(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._task = None

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.snapshots.clear()
        await self.reader.close()
