"""The worker's one boundary to Kafka's consumer group: ``GroupConsumer``.

The worker joins the group, learns of assignments, fetches, seeks and asks for end
offsets only through this protocol. It never commits through it: a batch's offsets are
committed inside that batch's Kafka transaction (``_checkpoint``), beside its outputs and
its lanes' state. ``KafkaGroupConsumer`` is the implementation, on aiokafka's group
consumer with public calls only:

- ``isolation_level="read_committed"``: records of an aborted or open transaction (a
  zombie's forwarded copies, a crashed batch's outputs) are never delivered;
- ``SlotAssignor`` (``_assignor``): partition ``p`` of every subscribed topic with the
  same partition count goes to one member, so a slot (``p`` of the input, channel-operation
  and repartition topics) is never split between processes, and a slot stays with its
  owner when others join or leave; the worker checks co-partitioning on every assignment
  (``check_copartitioned``). It is the only assignor offered: aiokafka (0.14) sends one
  JoinGroup per assignor it is given, each with one more protocol than the last, and the
  broker takes each later one as a member changing its protocols and rebalances again;
  two members joining at once rebalanced in a loop for minutes that way;
- auto-commit off, and an explicit session timeout (``Settings.consumer_session_timeout_s``):
  a paused process loses its partitions after it, and its writes are fenced;
- ``epoch`` counts the group's callbacks (revocations and assignments), for logs and tests.

Example::

    consumer = KafkaGroupConsumer("prism-pipeline", settings.aiokafka_kwargs())
    await consumer.start(["prism.agent-events"], handler)   # handler.assigned / .revoked
    fetched = await consumer.fetch(5000, timeout_s=1.0, linger_s=0.05)  # {tp: records}, in order
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from aiokafka import TopicPartition
from aiokafka.abc import ConsumerRebalanceListener

from ..core import InRecord
from ..retry import retry_transient
from ..settings import Settings
from ._records import in_record

__all__ = [
    "CoPartitioningError",
    "Fetched",
    "GroupConsumer",
    "KafkaGroupConsumer",
    "RebalanceHandler",
    "check_copartitioned",
]

log = logging.getLogger("prism.worker")

T = TypeVar("T")


class CoPartitioningError(RuntimeError):
    """An assignment split one slot's topics between processes."""


class RebalanceHandler(Protocol):
    """What the worker does when the group takes partitions away or hands them over."""

    async def revoked(self, tps: set[TopicPartition]) -> None: ...

    async def assigned(self, tps: set[TopicPartition]) -> None: ...


@dataclass(frozen=True, slots=True)
class Fetched:
    """Records fetched in assignment ``epoch``, per partition in offset order."""

    epoch: int
    records: dict[TopicPartition, list[InRecord]] = field(default_factory=dict)

    def __len__(self) -> int:
        return sum(map(len, self.records.values()))


class GroupConsumer(Protocol):
    """The consumer-group operations the worker uses, and nothing else."""

    epoch: int

    async def start(self, topics: Collection[str], handler: RebalanceHandler) -> None: ...

    async def fetch(self, max_records: int, timeout_s: float, linger_s: float = 0.0) -> Fetched: ...

    def seek(self, tp: TopicPartition, offset: int) -> None: ...

    def pause(self, tps: Collection[TopicPartition]) -> None: ...

    def resume(self, tps: Collection[TopicPartition]) -> None: ...

    def assignment(self) -> set[TopicPartition]: ...

    def highwater(self, tp: TopicPartition) -> int | None: ...

    async def positions(self, tps: Collection[TopicPartition]) -> dict[TopicPartition, int]: ...

    async def end_offsets(self, tps: Collection[TopicPartition]) -> dict[TopicPartition, int]: ...

    async def beginning_offsets(
        self, tps: Collection[TopicPartition]
    ) -> dict[TopicPartition, int]: ...

    async def committed(
        self, tps: Collection[TopicPartition]
    ) -> dict[TopicPartition, tuple[int, str]]: ...

    async def stop(self) -> None: ...


def _extend(batch: dict[TopicPartition, list[Any]], more: dict[TopicPartition, list[Any]]) -> int:
    """Add ``more`` (aiokafka's ``getmany``) to ``batch`` after each partition's records in
    it; the records added."""
    for tp, recs in more.items():
        batch.setdefault(tp, []).extend(recs)
    return sum(map(len, more.values()))


def check_copartitioned(
    assigned: Iterable[TopicPartition], topics: Collection[str]
) -> dict[int, set[TopicPartition]]:
    """The slots of an assignment: partition number -> its partitions of ``topics``.

    Raises ``CoPartitioningError`` naming the slot when this process holds partition ``p``
    of some of ``topics`` but not of all: its runs would be split between processes."""
    slots: dict[int, set[TopicPartition]] = {}
    for tp in assigned:
        if tp.topic in topics:
            slots.setdefault(tp.partition, set()).add(tp)
    for p, tps in sorted(slots.items()):
        missing = set(topics) - {tp.topic for tp in tps}
        if missing:
            raise CoPartitioningError(
                f"partition {p} of {sorted(t.topic for t in tps)} was assigned without "
                f"partition {p} of {sorted(missing)}: the group's assignor must keep partitions of "
                "one number together (prism-slots or range) and the topics must have the same "
                "partition count"
            )
    return slots


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, owner: KafkaGroupConsumer, handler: RebalanceHandler) -> None:
        self.owner = owner
        self.handler = handler

    async def on_partitions_revoked(self, revoked: Any) -> None:
        self.owner.epoch += 1
        await self.handler.revoked(set(revoked))

    async def on_partitions_assigned(self, assigned: Any) -> None:
        self.owner.epoch += 1
        await self.handler.assigned(set(assigned))


FETCH_BYTES = 1024 * 1024
"""What one fetch takes of a partition (aiokafka's ``max_partition_fetch_bytes``; a larger
record still comes whole: the broker returns the first batch whatever its size). A batch
is mostly the chunks in hand when it is taken, often one partition's, so the chunk sets
the batch's size and with it how far each batch's fixed costs (four transactions, an
insert per table) are shared: 256 KiB chunks made batches of ~1,200 events over a
backlog, 1 MiB ones ~4,750, and the worker 22-35% faster (bench/README.md). The chunk
no longer decides fairness: ``_fair_take`` gives every partition in hand its share of
each batch first (before it, a 2 MiB chunk kept a quiet partition waiting 31 s behind
busy ones, and 256 KiB chunks were the remedy)."""


POSITION_WAIT_S = 0.25
"""How long ``positions`` waits in all for positions still being reset; a known one is
there at once, and the tick that asks again comes a second later."""


FAIR_SHARE = 8
"""What each partition in hand gets of a fetch at least, before the rest fills it in
aiokafka's order (``_fair_take``): every partition with records moves in every batch,
and the rest of the batch still comes from few partitions. Each batch rewrites the state
of every run it touches; modelled over the first 1.2M input events of a 10-minute soak's
fleet, all 12 partitions behind, batches of 5,000 write 0.090 run states per event taken
in 2,500-record chunks, 0.184 shared evenly over the partitions, 0.099 with 8 first from
each (16: 0.105, 64: 0.131). With even shares, the seed 9 soak's workers peaked at 3.4 GB
(2.8-2.9 GB before)."""


class KafkaGroupConsumer:
    """``GroupConsumer`` on aiokafka's ``AIOKafkaConsumer`` (see the module docstring)."""

    def __init__(
        self,
        group: str,
        kafka_kwargs: dict[str, Any],
        *,
        session_timeout_s: float = 10.0,
        max_poll_records: int = 5000,
        max_partition_fetch_bytes: int = 1_048_576,
        instance_id: str | None = None,
    ) -> None:
        self.group = group
        self.instance_id = instance_id  # static membership (KIP-345); None: dynamic
        self.kwargs = kafka_kwargs
        self.session_timeout_s = session_timeout_s
        self.max_poll_records = max_poll_records
        self.max_partition_fetch_bytes = max_partition_fetch_bytes
        self.epoch = 0
        self._turn = 0  # where the next fair take starts (``_fair_take``)
        self._consumer: Any = None
        self._admin: Any = None
        self._ends: Any = None  # a consumer outside the group, for end offsets alone

    @classmethod
    def of(cls, settings: Settings, group: str, kafka_kwargs: dict[str, Any]) -> KafkaGroupConsumer:
        """The worker's consumer as ``settings`` configure it."""
        return cls(
            group,
            kafka_kwargs,
            session_timeout_s=settings.consumer_session_timeout_seconds,
            max_poll_records=settings.batch_max_events,
            max_partition_fetch_bytes=FETCH_BYTES,
            instance_id=settings.consumer_group_instance_id,
        )

    async def start(self, topics: Collection[str], handler: RebalanceHandler) -> None:
        from aiokafka import AIOKafkaConsumer

        from ._assignor import SlotAssignor

        session_ms = int(self.session_timeout_s * 1000)
        consumer = AIOKafkaConsumer(
            group_id=self.group,
            group_instance_id=self.instance_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            partition_assignment_strategy=(SlotAssignor(),),  # one: see the module docstring
            session_timeout_ms=session_ms,
            heartbeat_interval_ms=max(100, session_ms // 3),
            rebalance_timeout_ms=max(60_000, session_ms),
            max_poll_interval_ms=300_000,
            max_poll_records=self.max_poll_records,
            max_partition_fetch_bytes=self.max_partition_fetch_bytes,
            **self.kwargs,
        )
        await retry_transient(
            consumer.start,
            what=f"starting the consumer of group {self.group}",
            bootstrap=str(self.kwargs.get("bootstrap_servers", "")),
        )
        consumer.subscribe(topics=list(topics), listener=_Listener(self, handler))
        self._consumer = consumer

    async def fetch(self, max_records: int, timeout_s: float, linger_s: float = 0.0) -> Fetched:
        """Up to ``max_records`` fetched records, each partition's in offset order, every
        partition with records in hand getting its share first (``_fair_take``); waits up
        to ``timeout_s`` only when none are in hand.

        Records in hand were fetched while the last batch was handled, mostly at its
        start: aiokafka fetches a partition again only once its records in hand are all
        taken. So when this takes all of them and could take more, it waits up to
        ``linger_s`` for the fetch that taking them started (it returns as soon as records
        come). Without it, at 5,000 events/s a batch of ~3,000 records was followed by
        one of ~120, the few fetched at its start, which paid a whole batch's inserts and
        transactions while the rest waited at the broker."""
        epoch = self.epoch
        c = self._consumer
        batch = await self._fair_take(max_records)
        in_hand = taken = sum(map(len, batch.values()))
        if taken < max_records:  # the rest from whatever is in hand, or wait for some
            wait_ms = 0 if taken else int(timeout_s * 1000)
            rest = await c.getmany(timeout_ms=wait_ms, max_records=max_records - taken)
            taken += _extend(batch, rest)
        if in_hand and taken < max_records and linger_s > 0:  # and what came since
            linger_ms = int(linger_s * 1000)
            more = await c.getmany(timeout_ms=linger_ms, max_records=max_records - taken)
            taken += _extend(batch, more)
        return Fetched(
            epoch, {tp: [in_record(r) for r in recs] for tp, recs in batch.items() if recs}
        )

    async def _fair_take(self, max_records: int) -> dict[TopicPartition, list[Any]]:
        """Up to ``FAIR_SHARE`` records (less when ``max_records`` is shared by more
        partitions) from each assigned, unpaused partition's records in hand, starting one
        partition further on each call.

        aiokafka hands out records partition by partition, in the order their fetches
        arrived, and a partition with records left keeps its place at the front: a quiet
        partition's one record, fetched after the busy partitions' chunks, waited behind
        all of them. Under load after a slot moved (tens of thousands of records in hand)
        that was 10 s and more of no progress on the quiet partition (a 10-minute soak
        failed its 45 s progress bound on a channel-operations repartition partition
        this way). ``getmany(tp, timeout_ms=0)`` takes from one partition without waiting.
        The share is small so that a batch still comes mostly from few partitions
        (``FAIR_SHARE``)."""
        c = self._consumer
        live = sorted(c.assignment() - c.paused())
        if not live:
            return {}
        self._turn = (self._turn + 1) % len(live)
        share = max(1, min(FAIR_SHARE, max_records // len(live)))
        out: dict[TopicPartition, list[Any]] = {}
        left = max_records
        for tp in live[self._turn :] + live[: self._turn]:
            got = (await c.getmany(tp, timeout_ms=0, max_records=min(share, left))).get(tp)
            if got:
                out[tp] = got
                left -= len(got)
                if left <= 0:
                    break
        return out

    def seek(self, tp: TopicPartition, offset: int) -> None:
        if self._consumer is not None:  # None: stopping, the next owner seeks for itself
            self._consumer.seek(tp, offset)

    def pause(self, tps: Collection[TopicPartition]) -> None:
        """No fetches of ``tps`` (those still assigned) until ``resume``."""
        if self._consumer is not None:
            self._consumer.pause(*(set(tps) & self._consumer.assignment()))

    def resume(self, tps: Collection[TopicPartition]) -> None:
        if self._consumer is not None:
            self._consumer.resume(*(set(tps) & self._consumer.assignment()))

    def assignment(self) -> set[TopicPartition]:
        if self._consumer is None:
            return set()
        return set(self._consumer.assignment())

    def highwater(self, tp: TopicPartition) -> int | None:
        """The end offset as the last fetch of ``tp`` saw it (a cached figure)."""
        try:
            end = self._consumer.highwater(tp)
        except Exception:  # not assigned (any more)
            return None
        return None if end is None else int(end)

    async def positions(self, tps: Collection[TopicPartition]) -> dict[TopicPartition, int]:
        """The offset of the next record the consumer will hand out, for each of ``tps``
        whose position is known within ``POSITION_WAIT_S`` in all; one still being reset
        (assigned, not sought yet) or no longer assigned is left out. aiokafka's
        ``position`` waits until a position is known: one by one with a timeout each,
        that held a worker's tick (and the slots it holds) for seconds in a soak."""
        if not tps or self._consumer is None:
            return {}
        asked = {asyncio.ensure_future(self._consumer.position(tp)): tp for tp in tps}
        done, waiting = await asyncio.wait(asked, timeout=POSITION_WAIT_S)
        for task in waiting:
            task.cancel()
        if waiting:
            await asyncio.wait(waiting)  # cancelled: nothing left running
        return {asked[t]: int(t.result()) for t in done if t.exception() is None}

    async def end_offsets(self, tps: Collection[TopicPartition]) -> dict[TopicPartition, int]:
        """End offsets from a real offsets request (the last stable offset: read_committed).

        Asked on connections of their own: a broker answers one request of a connection
        at a time, so on the group consumer's the request waited behind its long-polling
        fetches (up to ``fetch_max_wait_ms``, 500 ms, for a quiet partition), and the
        timer's tick, which holds the slots, spent 11% of the worker's time there."""
        if not tps:
            return {}
        if self._ends is None:
            from aiokafka import AIOKafkaConsumer

            ends = AIOKafkaConsumer(
                enable_auto_commit=False, isolation_level="read_committed", **self.kwargs
            )
            try:
                await ends.start()
            except BaseException:
                await ends.stop()
                raise
            self._ends = ends
        try:
            found = await self._ends.end_offsets(list(tps))
        except Exception:  # a broken connection: a new client on the next tick
            ends, self._ends = self._ends, None
            await ends.stop()
            raise
        return {tp: int(o) for tp, o in found.items()}

    async def beginning_offsets(self, tps: Collection[TopicPartition]) -> dict[TopicPartition, int]:
        """The first offset still in each partition's log."""
        if not tps:
            return {}
        starts = await self._retried(
            lambda: self._consumer.beginning_offsets(list(tps)), "reading log start offsets"
        )
        return {tp: int(o) for tp, o in starts.items()}

    async def committed(
        self, tps: Collection[TopicPartition]
    ) -> dict[TopicPartition, tuple[int, str]]:
        """The group's committed offset and metadata of each of ``tps`` that has one."""
        if not tps:
            return {}

        async def fetch() -> Any:
            if self._admin is None:
                from aiokafka.admin import AIOKafkaAdminClient

                admin = AIOKafkaAdminClient(**self.kwargs)
                try:
                    await admin.start()
                except BaseException:
                    await admin.close()
                    raise
                self._admin = admin
            try:
                return await self._admin.list_consumer_group_offsets(
                    self.group, partitions=list(tps)
                )
            except Exception:  # a broken connection: a new admin client on the next try
                admin, self._admin = self._admin, None
                await admin.close()
                raise

        found = await self._retried(fetch, f"reading the committed offsets of {self.group}")
        return {
            tp: (int(om.offset), om.metadata or "")
            for tp, om in found.items()
            if om is not None and om.offset is not None and om.offset >= 0
        }

    async def _retried(self, op: Callable[[], Awaitable[T]], what: str) -> T:
        """``op`` with transient broker errors (a broker away, no leader) retried with
        backoff: a takeover must not fail on a broker restart (``retry.retry_transient``)."""
        return await retry_transient(
            op, what=what, bootstrap=str(self.kwargs.get("bootstrap_servers", ""))
        )

    async def stop(self) -> None:
        consumer, self._consumer = self._consumer, None
        admin, self._admin = self._admin, None
        ends, self._ends = self._ends, None
        for client, what in (
            (consumer, "consumer"),
            (admin, "admin client"),
            (ends, "offsets client"),
        ):
            if client is None:
                continue
            try:
                await client.close() if what == "admin client" else await client.stop()
            except Exception:  # stopping after a broker error: nothing more to do
                log.debug("the group %s did not stop cleanly", what, exc_info=True)
