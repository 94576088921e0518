"""Kafka replay consumers: one run from its partition (``tail_run``), or every run (``follow``).

Both read without a consumer group and commit nothing, so they never disturb the worker.
A run lives on one partition (key = runId, the Java/aiokafka default partitioner), so
``tail_run`` reads only that partition, from the run's first offset when the ledger knows
it, and stops as soon as the run is complete by the contract's rule.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from prism.schemas import ContractViolation

from ..core import home_partition
from ..retry import DEFAULT_DEADLINE, retry_transient
from ..settings import Settings
from ._errors import TopicNotFound
from ._events import ReplayEvent, event_from_record
from ._sequencer import RunSequencer, TailResult

__all__ = ["FollowResult", "follow", "partition_for", "tail_run", "topic_partitions"]

log = logging.getLogger("prism.replay")

EventCallback = Callable[[ReplayEvent], None]
_POLL_S = 0.5
_SEEN_IDS = 100_000  # event ids remembered by ``follow`` to print each event once


def partition_for(run_id: str, partitions: int) -> int:
    """The partition Kafka's default partitioner gives key ``run_id`` (murmur2, positive, mod n).

    Example::

        partition_for("run-42", 4)   # the same partition the publisher produced to
    """
    if partitions < 1:
        raise ValueError(f"a topic has at least one partition, got partitions={partitions}")
    return home_partition(run_id.encode(), partitions)


async def topic_partitions(
    settings: Settings, topic: str, *, deadline: float = DEFAULT_DEADLINE
) -> list[int]:
    """The partition ids of ``topic``; ``TopicNotFound`` if the broker does not know it.

    A broker that does not answer is retried for ``deadline`` seconds in all, each attempt
    included, then ``BrokerUnavailable``.
    """
    until = asyncio.get_running_loop().time() + deadline

    async def describe() -> list[Any]:
        admin = AIOKafkaAdminClient(**settings.aiokafka_kwargs())
        try:
            async with _answer_by(until):
                await admin.start()
                # all topics: naming one could auto-create it
                return list(await admin.describe_topics())
        finally:
            await admin.close()

    described = await retry_transient(
        describe,
        what=f"describing topic {topic}",
        bootstrap=settings.kafka_bootstrap_servers,
        deadline=deadline,
    )
    for meta in described:
        if meta["topic"] == topic and meta["error_code"] == 0:
            return sorted(p["partition"] for p in meta["partitions"])
    raise TopicNotFound(
        f"topic {topic!r} does not exist at {settings.kafka_bootstrap_servers}; check the "
        "topic prefix (PRISM_TOPIC_PREFIX) and the broker (PRISM_KAFKA_BOOTSTRAP_SERVERS)"
    )


@contextlib.asynccontextmanager
async def _answer_by(until: float) -> AsyncIterator[None]:
    """One attempt cut at loop time ``until``: a ``TimeoutError`` that says so."""
    try:
        async with asyncio.timeout_at(until):
            yield
    except TimeoutError:
        raise TimeoutError("no answer in the time given") from None


class _Consumer(AIOKafkaConsumer):
    """A group-less consumer whose ``start`` retries transient broker errors up to a deadline.

    The deadline bounds the retries and each attempt: ``deadline`` seconds from ``start``.
    """

    def __init__(self, bootstrap: str, deadline: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._bootstrap = bootstrap
        self._deadline = deadline

    async def start(self) -> None:
        until = asyncio.get_running_loop().time() + self._deadline

        async def attempt() -> None:
            async with _answer_by(until):
                await super(_Consumer, self).start()

        # A failed start leaves no fetcher behind, so the same consumer can start again.
        await retry_transient(
            attempt,
            what="starting a Kafka consumer",
            bootstrap=self._bootstrap,
            deadline=self._deadline,
        )


def _consumer(settings: Settings, deadline: float = DEFAULT_DEADLINE) -> AIOKafkaConsumer:
    return _Consumer(
        settings.kafka_bootstrap_servers,
        deadline,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_bytes=max(52_428_800, settings.max_event_bytes * 2),
        max_partition_fetch_bytes=max(1_048_576, settings.max_event_bytes * 2),
        **settings.aiokafka_kwargs(),
    )


class _Clock:
    """What is left of a command's ``timeout``: every step, connecting included, takes from it.

    Without a timeout the broker still gets ``DEFAULT_DEADLINE`` to answer at start.
    """

    def __init__(self, timeout: float | None) -> None:
        self._loop = asyncio.get_running_loop()
        self._end = None if timeout is None else self._loop.time() + timeout

    def left(self) -> float | None:
        return None if self._end is None else max(0.0, self._end - self._loop.time())

    def connect_deadline(self) -> float:
        left = self.left()
        return DEFAULT_DEADLINE if left is None else left


async def tail_run(
    settings: Settings,
    run_id: str,
    on_event: EventCallback,
    *,
    timeout: float | None = 60.0,
    start_offset: int | Callable[[str, int], int | None] | None = None,
    topic: str | None = None,
) -> TailResult:
    """Print-as-you-go replay of one run from Kafka, in seq order, ending on its terminal.

    ``on_event`` receives each event once, in seq order, as soon as every lower seq has
    arrived. Returns when the run is complete or, after ``timeout`` seconds, with the
    missing seqs (what was buffered behind a gap is released first, still in order).
    ``start_offset`` is where to seek the run's partition, or a function of (topic,
    partition) returning it or None (e.g. one that asks ``ledger_start_offset``); without
    one the partition is read from its beginning. ``timeout`` bounds the whole tail,
    reaching the broker included: a broker that does not answer in time is
    ``BrokerUnavailable``.

    Example::

        result = await tail_run(load_settings(), "run-42", lambda ev: print(ev.seq))
        result.complete, result.missing
    """
    topic = topic or settings.topics.input
    clock = _Clock(timeout)
    partitions = await topic_partitions(settings, topic, deadline=clock.connect_deadline())
    tp = TopicPartition(topic, partitions[partition_for(run_id, len(partitions))])
    if callable(start_offset):
        start_offset = start_offset(tp.topic, tp.partition)
    key = run_id.encode()
    seq = RunSequencer(run_id)
    invalid = 0
    consumer = _consumer(settings, clock.connect_deadline())
    await consumer.start()
    try:
        consumer.assign([tp])
        if start_offset is not None:
            consumer.seek(tp, start_offset)
        else:
            await consumer.seek_to_beginning(tp)
        log.debug(
            "tailing run %s on %s[%d] from %s",
            run_id,
            topic,
            tp.partition,
            start_offset if start_offset is not None else "the beginning",
        )
        async for rec in records_until(consumer, tp, lambda: seq.complete, clock.left()):
            if rec.key is not None and rec.key != key:
                continue
            ev = _event_of(rec, settings.max_event_bytes)
            if ev is None:
                invalid += rec.key == key
                continue
            for ready in seq.push(ev):
                on_event(ready)
    finally:
        await consumer.stop()
    for ready in seq.drain():  # timed out: what waited behind a gap, still in seq order
        on_event(ready)
    return seq.result(invalid=invalid)


def _event_of(rec: Any, max_bytes: int) -> ReplayEvent | None:
    """The replay event of a consumer record; None when the record breaks the contract."""
    try:
        return event_from_record(
            rec.value or b"", partition=rec.partition, offset=rec.offset, max_bytes=max_bytes
        )
    except ContractViolation:
        return None


async def records_until(
    consumer: AIOKafkaConsumer,
    tp: TopicPartition,
    done: Callable[[], bool],
    timeout: float | None,
) -> AsyncIterator[Any]:
    """``tp``'s records as they arrive, until ``done()`` or ``timeout`` seconds have passed."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    while not done():
        wait = _POLL_S if deadline is None else min(_POLL_S, deadline - loop.time())
        if wait <= 0:
            return
        batch = await consumer.getmany(tp, timeout_ms=int(wait * 1000))
        for rec in batch.get(tp, ()):
            yield rec
            if done():
                return


@dataclass(slots=True)
class FollowResult:
    """What ``follow`` saw: events printed, filtered out, duplicates and invalid records."""

    printed: int = 0
    filtered: int = 0
    duplicates: int = 0
    invalid: int = 0


async def follow(
    settings: Settings,
    on_event: EventCallback,
    *,
    tenants: Collection[str] = (),
    types: Collection[str] = (),
    from_beginning: bool = False,
    timeout: float | None = None,
    max_events: int | None = None,
    topic: str | None = None,
    ready: Callable[[], None] | None = None,
) -> FollowResult:
    """Tail every run of the topic live (or from the beginning), one callback per event.

    ``tenants`` / ``types`` keep only events of those tenants / types (empty: all). An
    event delivered twice (same ``eventId``) is passed once. Runs until ``timeout``
    seconds passed (reaching the broker included), ``max_events`` were passed, or the task
    is cancelled. ``ready`` is called once the consumer is positioned (events produced
    after it are seen).

    Example::

        await follow(load_settings(), print_event, types={"error"}, timeout=60)
    """
    topic = topic or settings.topics.input
    clock = _Clock(timeout)
    partitions = await topic_partitions(settings, topic, deadline=clock.connect_deadline())
    tps = [TopicPartition(topic, p) for p in partitions]
    tenant_set, type_set = frozenset(tenants), frozenset(types)
    seen: OrderedDict[str, None] = OrderedDict()
    result = FollowResult()
    consumer = _consumer(settings, clock.connect_deadline())
    await consumer.start()
    try:
        consumer.assign(tps)
        if from_beginning:
            await consumer.seek_to_beginning(*tps)
        else:
            await consumer.seek_to_end(*tps)
        for tp in tps:  # resolve positions now, so "live" starts here and not at the first poll
            await consumer.position(tp)
        if ready is not None:
            ready()
        while max_events is None or result.printed < max_events:
            left = clock.left()
            wait = _POLL_S if left is None else min(_POLL_S, left)
            if wait <= 0:
                break
            batch = await consumer.getmany(*tps, timeout_ms=int(wait * 1000))
            records = sorted(
                (r for recs in batch.values() for r in recs),
                key=lambda r: (r.timestamp, r.partition, r.offset),
            )
            for rec in records:
                _follow_one(rec, settings, tenant_set, type_set, seen, result, on_event)
                if max_events is not None and result.printed >= max_events:
                    break
    finally:
        await consumer.stop()
    return result


def _follow_one(
    rec: Any,
    settings: Settings,
    tenants: frozenset[str],
    types: frozenset[str],
    seen: OrderedDict[str, None],
    result: FollowResult,
    on_event: EventCallback,
) -> None:
    ev = _event_of(rec, settings.max_event_bytes)
    if ev is None:
        result.invalid += 1
        return
    if (tenants and ev.tenant_id not in tenants) or (types and ev.type not in types):
        result.filtered += 1
        return
    if ev.event_id in seen:
        result.duplicates += 1
        return
    seen[ev.event_id] = None
    if len(seen) > _SEEN_IDS:
        seen.popitem(last=False)
    on_event(ev)
    result.printed += 1
