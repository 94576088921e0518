"""The commit sequence of a batch: ledger first, then one Kafka transaction per slot.

A *slot* is partition ``p`` of the input, channel-operation and repartition topics, which
the group assigns together (``_consumer``); the alerter's partition of ``limit-deaths`` is
a slot of its own (``ALERTER``). Each slot has its own transactional producer, with a
``transactional.id`` made of the group and the slot, so whichever process the group
hands the slot to next fences this one by Kafka's producer epoch: its open transaction
is aborted and its later commits fail (``Fenced``).

The sequence, in the order the worker runs it for every batch and timer tick:

1. **Ledger.** The batch's rows are inserted and ClickHouse has acknowledged them
   (``core.store_isolating`` with ``LedgerStore``, in the step thread). Inserts carry
   deduplication tokens made of the source offsets, rows carry versions derived from
   them, and the tables replace by stable ids: storing the same batch twice changes no
   count.
2. **Kafka, per slot (``Checkpoint.commit``).** One transaction carries the slot's
   outputs (DLQ, quarantine, closed runs, alerts, limit deaths, forwarded copies), its
   lanes' state writes and position record, its lanes' event-time reports, and the
   consumer offsets of its partitions, with this process's commit token as the offsets'
   metadata. A slot that forwarded copies writes its position record again once the
   brokers acknowledged them, naming their offsets (``SlotCommit.tail``). Readers read
   committed: all of it appears at once, or none of it.
3. **After.** Notifiers get the batch's alert rows (at least once; receivers
   deduplicate by alert id), stats are counted.

What a crash leaves between the steps, and why it is safe:

- *before 1 ends*: nothing anywhere; the batch is delivered again from the committed
  offsets to a lane restored from the committed state.
- *between 1 and 2*: rows in the ledger, nothing in Kafka. The batch is delivered again
  to the same state, steps to the same rows, and the insert changes nothing (tokens,
  versions). Re-stepped runs emit the same outputs, once, in step 2.
- *inside 2*: the open transaction is aborted by the next owner's producer (same
  ``transactional.id``) or by the broker's transaction timeout; no reader sees it.
- *a zombie* (a paused process whose slot moved on) that wakes up: its insert lands in
  its own ledger with versions no newer than the new owner's rows of the same offsets,
  and its transaction fails ``Fenced``: no state, output or offset of it is visible.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiokafka import TopicPartition

from ..retry import retry_transient
from ..settings import Settings
from ._produce import ProducedRecord, send_records

__all__ = [
    "ALERTER",
    "Checkpoint",
    "Dropped",
    "Fenced",
    "Lost",
    "SlotCommit",
    "Transactions",
    "quiet_fenced_futures",
]

log = logging.getLogger("prism.worker")

ALERTER = "alerter"  # the slot of the limit-deaths partition


class Fenced(Exception):
    """A newer owner of the slot took over: this process may not write for it."""


class Lost(Fenced):
    """The transaction's outcome is unknown, with no sign of a newer owner: it did not
    end in time, or the producer's sender died on a lost connection (aiokafka ends a
    producer whose coordinator lookup went to a broker that died). Handled as fenced,
    but the slot is taken back as soon as the group still assigns it here: reopening
    its producer ends the transaction either way, and the restore reads which."""


@dataclass(frozen=True, slots=True)
class Dropped:
    """When a slot's (or the alerter's) commit was fenced here, and whether it was only
    ``Lost``: ``due`` says when it may be taken back (``Slots.reclaim``,
    ``AlertDesk.reclaim``), if the group still assigns it here."""

    at: float  # time.monotonic()
    lost: bool

    @classmethod
    def of(cls, why: Fenced) -> Dropped:
        return cls(time.monotonic(), isinstance(why, Lost))

    def due(self, after_s: float, now: float) -> bool:
        """A fenced one ``after_s`` later: a newer owner takes it only through a
        rebalance, which reaches this process within a session timeout, so one still
        assigned here after that was fenced by something else (its transaction outlived
        the broker's transaction timeout), and nobody else will read it. A lost one at
        once: it showed no sign of a newer owner, and is as much this process's as the
        slots it goes on committing for."""
        return self.lost or now - self.at >= after_s


class _Unusable(Exception):
    """A producer that a fatal error left unable to begin another transaction."""


_ABANDONED = "Future exception was never retrieved"  # asyncio's report of such a future


def quiet_fenced_futures(loop: asyncio.AbstractEventLoop) -> None:
    """Report the futures a fenced producer leaves behind at DEBUG instead of ERROR.

    When a producer is fenced, aiokafka's transaction manager sets ``ProducerFenced`` on a
    future of its own that no public call awaits any more (aborting a fenced transaction
    is refused before it waits), and the event loop logs that future at ERROR, with a
    traceback, when it is collected: two such reports per fence in the worker's log, for
    an event ``Transactions.commit`` already handled (``Fenced``, logged once). Every other
    report goes to the handler ``loop`` had.
    """
    from aiokafka.errors import ProducerFenced

    previous = loop.get_exception_handler()

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, ProducerFenced) and context.get("message") == _ABANDONED:
            log.debug("a fenced producer's own future, never awaited: %r", exc)
        elif previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)


@dataclass(slots=True)
class SlotCommit:
    """What one slot's transaction carries: records, and offsets (next offset to read).

    ``tail``: records that name where ``records`` landed, sent in the same transaction
    once the brokers acknowledged them (it gets the offset of the last record written to
    each (topic, partition)): the slot's position record with the offsets of the copies
    it forwarded (``_slotstate``)."""

    records: list[ProducedRecord] = field(default_factory=list)
    offsets: dict[TopicPartition, int] = field(default_factory=dict)
    tail: Callable[[Mapping[tuple[str, int], int]], list[ProducedRecord]] | None = None


class Transactions:
    """One transactional producer per slot this process holds."""

    def __init__(
        self,
        group: str,
        kafka_kwargs: dict[str, Any],
        *,
        max_request_size: int = 1_048_576,
        transaction_timeout_s: float = 60.0,
        give_up_s: float = 30.0,
        compression: str = "none",
    ) -> None:
        self.group = group
        self.kwargs = kafka_kwargs
        self.compression = None if compression == "none" else compression
        self.max_request_size = max_request_size
        self.transaction_timeout_s = transaction_timeout_s
        self.give_up_s = give_up_s  # a commit still retrying after this is handled as fenced
        self.producers: dict[str, Any] = {}
        self._stopping: set[asyncio.Task[None]] = set()  # producers given up on (``_let_go``)

    @classmethod
    def of(cls, settings: Settings, group: str, kafka_kwargs: dict[str, Any]) -> Transactions:
        """The worker's producers as ``settings`` configure them."""
        return cls(
            group,
            kafka_kwargs,
            max_request_size=settings.max_record_bytes,
            give_up_s=2 * settings.consumer_session_timeout_seconds,  # rebalances wait on it
            compression=settings.kafka_compression,
        )

    def transactional_id(self, slot: str) -> str:
        return f"{self.group}.{slot}"

    async def open(self, slot: str) -> None:
        """A new producer for ``slot``; starting it fences every earlier producer of the
        slot (in this process or another) and aborts its open transaction."""
        from aiokafka import AIOKafkaProducer
        from aiokafka.errors import KafkaConnectionError, KafkaError

        await self.close(slot)

        async def start() -> Any:
            producer = AIOKafkaProducer(
                transactional_id=self.transactional_id(slot),
                enable_idempotence=True,
                acks="all",
                linger_ms=5,
                max_batch_size=1_048_576,
                compression_type=self.compression,
                max_request_size=self.max_request_size,
                transaction_timeout_ms=int(self.transaction_timeout_s * 1000),
                **self.kwargs,
            )
            try:
                await producer.start()
            except BaseException as exc:
                await _stop_quietly(producer)
                if isinstance(exc, KafkaError) and _connection_lost(exc):
                    # its coordinator lookup went to a broker that died: a new producer
                    # asks again (aiokafka raises a plain, not retriable, KafkaError)
                    raise KafkaConnectionError(f"starting the producer: {exc}") from exc
                raise
            return producer

        self.producers[slot] = await retry_transient(
            start,
            what=f"opening the transactional producer {self.transactional_id(slot)}",
            bootstrap=str(self.kwargs.get("bootstrap_servers", "")),
        )

    async def close(self, slot: str) -> None:
        producer = self.producers.pop(slot, None)
        if producer is not None:
            await _stop_quietly(producer)

    async def close_all(self) -> None:
        for slot in list(self.producers):
            await self.close(slot)
        if self._stopping:  # given up on: their batches time out, or a newer producer fenced them
            await asyncio.wait(set(self._stopping), timeout=self.give_up_s)

    def _let_go(self, slot: str) -> None:
        """Close ``slot``'s producer without waiting for it: aiokafka's ``stop`` waits for
        the batches in flight, which a broker away holds until they time out (the give-up
        took 40 s instead of 20 in a soak, the slot standing still). The slot's next
        producer fences it."""
        producer = self.producers.pop(slot, None)
        if producer is not None:
            task = asyncio.ensure_future(_stop_quietly(producer))
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)

    async def commit(
        self, slot: str, commit: SlotCommit, metadata: str
    ) -> dict[tuple[str, int], int]:
        """One transaction: ``commit``'s records and offsets (with ``metadata``), or none
        of them. Transient errors abort and retry the whole transaction; ``Fenced`` when
        a newer owner holds the slot (the producer is closed then). Returns the offset of
        the last record written to each (topic, partition)."""
        from aiokafka.errors import (
            IllegalOperation,
            KafkaError,
            ProducerFenced,
            TransactionalIdAuthorizationFailed,
        )

        producer = self.producers.get(slot)
        if producer is None:
            raise Fenced(f"no producer for slot {slot}: it is not held")

        async def once() -> dict[tuple[str, int], int]:
            try:
                await producer.begin_transaction()
            except KafkaError:
                raise
            except Exception as exc:  # aiokafka's state check: a fatal error before
                raise _Unusable(f"its producer cannot begin a transaction ({exc!r})") from exc
            try:
                produced = await send_records(producer, commit.records)
                if commit.tail is not None:
                    last = await send_records(producer, commit.tail(produced))
                    produced = {**produced, **last}
                if commit.offsets:
                    offsets = {tp: (o, metadata) for tp, o in commit.offsets.items()}
                    await producer.send_offsets_to_transaction(offsets, self.group)
            except asyncio.CancelledError:
                raise  # the give-up, below: an abort would wait for the broker too
            except BaseException:
                try:
                    await producer.abort_transaction()
                except Exception:  # fenced or broken: the broker aborts it in any case
                    log.debug("aborting the transaction of %s failed", slot, exc_info=True)
                raise
            await producer.commit_transaction()
            return produced

        try:
            async with asyncio.timeout(self.give_up_s):
                return await retry_transient(
                    once,
                    what=f"committing the transaction of slot {slot}",
                    bootstrap=str(self.kwargs.get("bootstrap_servers", "")),
                    deadline=float("inf"),
                )
        except TimeoutError as exc:
            # A broker away (or a coordinator moving) holds the commit; the batch lock
            # is held meanwhile, and with it this process's take-over of its next
            # assignment. Its outcome unknown and no newer owner in sight, the slot is
            # lost: dropped, and taken back from what was committed while the group
            # still assigns it here (``Slots.reclaim``), not after the wait a fence gets.
            self._let_go(slot)
            raise Lost(f"slot {slot}: the transaction did not end in {self.give_up_s:g}s") from exc
        except _Unusable as exc:  # the sender died on a fatal error: as fenced, below
            await self.close(slot)
            raise Fenced(f"slot {slot}: {exc}") from exc
        except (ProducerFenced, TransactionalIdAuthorizationFailed, IllegalOperation) as exc:
            await self.close(slot)
            raise Fenced(f"slot {slot}: {exc}") from exc
        except KafkaError as exc:
            # Not retriable and not named a fence: the transaction's outcome is unknown to
            # this process (a broker answered UnknownError to an EndTxn that raced a new
            # owner's epoch fence, and the producer's sender died with it). The slot is
            # handled as fenced: its producer closed, its state dropped, and taken back
            # from Kafka's committed state if the group still assigns it here (``reclaim``).
            await self.close(slot)
            if _connection_lost(exc):
                raise Lost(
                    f"slot {slot}: its producer died on a lost connection ({exc!r})"
                ) from exc
            raise Fenced(f"slot {slot}: the transaction failed ({exc!r})") from exc


class Checkpoint:
    """Step 2 of the sequence for every slot of a batch (see the module docstring).

    ``token`` names this process; each slot's commits are numbered, and the offsets'
    metadata says ``<token>:<n>``, so an owner that gets a slot back can tell whether
    anyone committed for it in between (``last``)."""

    def __init__(self, transactions: Transactions, token: str) -> None:
        self.transactions = transactions
        self.token = token
        self.last: dict[str, str] = {}  # slot -> metadata of its last commit here
        self._seq = 0
        self.fenced_writes = 0
        self.produced: dict[tuple[str, int], int] = {}  # (topic, partition) -> last offset

    async def commit(self, commits: Mapping[str, SlotCommit]) -> dict[str, Fenced]:
        """Commit each slot's transaction (concurrently); the slots found fenced (``Lost``
        ones among them), each with what fenced it."""
        slots: Sequence[str] = sorted(commits)
        results = await asyncio.gather(
            *(self._one(slot, commits[slot]) for slot in slots), return_exceptions=True
        )
        fenced: dict[str, Fenced] = {}
        for slot, result in zip(slots, results, strict=True):
            if isinstance(result, Fenced):
                self.fenced_writes += 1
                self.last.pop(slot, None)
                if isinstance(result, Lost):
                    log.warning("%s; the slot is taken back from its committed state", result)
                else:
                    log.warning("%s; its batch is left to the slot's new owner", result)
                fenced[slot] = result
            elif isinstance(result, BaseException):
                raise result
        return fenced

    async def _one(self, slot: str, commit: SlotCommit) -> None:
        self._seq += 1
        metadata = f"{self.token}:{self._seq}"
        produced = await self.transactions.commit(slot, commit, metadata)
        if commit.offsets:
            self.last[slot] = metadata
        for key, offset in produced.items():
            self.produced[key] = max(self.produced.get(key, -1), offset)


def _connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` came of a lost connection and of nothing that names a fence, by
    the exceptions it was raised from (aiokafka wraps the cause in ``KafkaError``s)."""
    from aiokafka.errors import (
        InvalidProducerEpoch,
        KafkaConnectionError,
        ProducerFenced,
        TransactionCoordinatorFenced,
    )

    fences = (InvalidProducerEpoch, ProducerFenced, TransactionCoordinatorFenced)
    lost = False
    seen: set[int] = set()
    at: BaseException | None = exc
    while at is not None and id(at) not in seen:
        seen.add(id(at))
        if isinstance(at, fences):
            return False
        lost = lost or isinstance(at, KafkaConnectionError)
        at = at.__cause__ or at.__context__
    return lost


async def _stop_quietly(producer: Any) -> None:
    try:
        await producer.stop()
    except Exception:  # fenced or the broker is away: nothing more to do
        log.debug("a transactional producer did not stop cleanly", exc_info=True)
