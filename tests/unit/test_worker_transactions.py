"""``Transactions.commit``: which failures of a slot's transaction fence the slot.

The producer is a stand-in with aiokafka's transactional methods, so the real
``Transactions`` code decides. A commit whose outcome this process cannot know (the
broker answered an EndTxn that raced a new owner's epoch fence with UnknownError, and
aiokafka's sender died with "Unexpected error during batch delivery") must not stop the
worker: the slot is handled as fenced, its producer closed, and the group decides who
holds it next. A commit that did not end in time, or whose producer died on a lost
connection, is ``Lost``: fenced, but taken back at once while the group assigns it here.
Transient errors retry the whole transaction; a bug is raised unchanged.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import (
    InvalidProducerEpoch,
    KafkaConnectionError,
    KafkaError,
    ProducerFenced,
)

from prism.pipeline.worker._checkpoint import Checkpoint, Fenced, Lost, SlotCommit, Transactions


class _Producer:
    """Records the transaction calls; ``commit_transaction`` raises the queued errors
    (``hang``: waits forever instead); after ``fatal`` it cannot begin again."""

    def __init__(self, errors: list[BaseException], *, fatal: bool = False) -> None:
        self.errors = errors
        self.calls: list[str] = []
        self.stopped = False
        self.fatal = fatal
        self.hang = False
        self.stop_hangs = False  # as aiokafka's stop, waiting for batches a broker holds
        self.stopping = False

    async def begin_transaction(self) -> None:
        self.calls.append("begin")
        if self.fatal and self.calls.count("begin") > 1:  # as aiokafka's state check says
            raise AssertionError("Invalid state transition FATAL_ERROR -> IN_TRANSACTION")

    async def send_offsets_to_transaction(self, offsets: Any, group: str) -> None:
        self.calls.append(
            f"offsets:{group}:{sorted((tp.partition, o) for tp, o in offsets.items())}"
        )

    async def commit_transaction(self) -> None:
        self.calls.append("commit")
        if self.hang:
            await asyncio.Event().wait()
        if self.errors:
            raise self.errors.pop(0)

    async def abort_transaction(self) -> None:
        self.calls.append("abort")

    async def stop(self) -> None:
        self.stopping = True
        if self.stop_hangs:
            await asyncio.Event().wait()
        self.stopped = True


def _commit(producer: _Producer) -> tuple[Transactions, Checkpoint]:
    txns = Transactions("g", {"bootstrap_servers": "127.0.0.1:1"})
    txns.producers["3"] = producer
    return txns, Checkpoint(txns, "tok")


_OFFSETS = SlotCommit([], {TopicPartition("in", 3): 42})


def test_an_unknown_outcome_of_the_commit_fences_the_slot_instead_of_stopping_the_worker() -> None:
    sender_died = KafkaError("Unexpected error during batch delivery")
    producer = _Producer([sender_died])
    txns, checkpoint = _commit(producer)
    fenced = asyncio.run(checkpoint.commit({"3": _OFFSETS}))
    assert set(fenced) == {"3"} and not isinstance(fenced["3"], Lost)  # it may be a fence
    assert producer.stopped and "3" not in txns.producers  # closed: a new one is opened later
    assert checkpoint.fenced_writes == 1 and "3" not in checkpoint.last
    assert producer.calls == ["begin", "offsets:g:[(3, (42, 'tok:1'))]", "commit"]


def test_a_fence_named_by_the_broker_fences_the_slot() -> None:
    producer = _Producer([ProducerFenced()])
    txns, _ = _commit(producer)
    with pytest.raises(Fenced, match="slot 3"):
        asyncio.run(txns.commit("3", _OFFSETS, "tok:1"))
    assert producer.stopped


def test_a_transient_error_retries_the_whole_transaction() -> None:
    producer = _Producer([KafkaConnectionError()])
    _, checkpoint = _commit(producer)
    assert asyncio.run(checkpoint.commit({"3": _OFFSETS})) == {}
    assert producer.calls.count("begin") == 2 and producer.calls.count("commit") == 2
    assert checkpoint.last == {"3": "tok:1"} and not producer.stopped


def test_a_bug_is_raised_unchanged() -> None:
    producer = _Producer([ZeroDivisionError("a bug")])
    _, checkpoint = _commit(producer)
    with pytest.raises(ZeroDivisionError):
        asyncio.run(checkpoint.commit({"3": _OFFSETS}))
    assert not producer.stopped


def test_a_producer_left_unusable_by_a_fatal_error_fences_the_slot() -> None:
    """A broker SIGKILLed mid-transaction: the send failed with a transient error while the
    producer's sender died (OutOfOrderSequenceNumber), and the retry's begin_transaction
    raised aiokafka's state assertion, which stopped the worker (seen in a chaos soak)."""
    producer = _Producer([KafkaConnectionError()], fatal=True)
    txns, checkpoint = _commit(producer)
    assert set(asyncio.run(checkpoint.commit({"3": _OFFSETS}))) == {"3"}
    assert producer.stopped and "3" not in txns.producers
    assert producer.calls.count("begin") == 2 and producer.calls.count("commit") == 1


def test_a_transaction_that_does_not_end_in_time_fences_the_slot() -> None:
    """A commit held by a broker away holds the slot (and a take-over waits for the batch
    lock): it may not take longer than ``give_up_s``, nor wait after it for an abort or
    for the producer to stop, both of which wait for the same broker."""
    producer = _Producer([])
    producer.hang = producer.stop_hangs = True
    txns, _ = _commit(producer)
    txns.give_up_s = 0.2

    async def go() -> None:
        async with asyncio.timeout(5):  # the old code waited for the stop: forever here
            with pytest.raises(Lost, match=r"slot 3: the transaction did not end in 0.2s"):
                await txns.commit("3", _OFFSETS, "tok:1")
        assert "3" not in txns.producers  # the slot's next producer fences this one
        await asyncio.sleep(0)
        assert producer.stopping and not producer.stopped  # stopping behind the worker
        await txns.close_all()  # at shutdown: waits for it, give_up_s at most

    asyncio.run(go())
    assert "abort" not in producer.calls


def _chain(*errors: BaseException) -> BaseException:
    """``errors[0]`` raised from ``errors[1]``, raised from ``errors[2]``, ..."""
    for err, cause in itertools.pairwise(errors):
        err.__cause__ = cause
    return errors[0]


def _sender_death(cause: BaseException) -> BaseException:
    """What aiokafka's producer raises once its sender died, chained as it chains it."""
    return _chain(
        KafkaError("Unexpected error during batch delivery"), KafkaError(repr(cause)), cause
    )


def _closed() -> KafkaConnectionError:
    return KafkaConnectionError("Connection at 127.0.0.1:9094 closed")


def test_a_producer_that_died_on_a_lost_connection_loses_the_slot_without_a_fence() -> None:
    """A coordinator lookup sent to a broker that died ends aiokafka's sender (seen with
    a 3-broker cluster, a broker SIGKILLed as eight producers began their transactions):
    no newer owner is in sight, so the slot is ``Lost`` and taken back at once."""
    producer = _Producer([_sender_death(_closed())])
    txns, checkpoint = _commit(producer)
    fenced = asyncio.run(checkpoint.commit({"3": _OFFSETS}))
    assert set(fenced) == {"3"} and isinstance(fenced["3"], Lost)
    assert "lost connection" in str(fenced["3"])
    assert producer.stopped and "3" not in txns.producers and "3" not in checkpoint.last


@pytest.mark.parametrize(
    "cause",
    [
        lambda: KafkaError("UnknownError"),
        lambda: _chain(_closed(), ProducerFenced()),
        lambda: _chain(InvalidProducerEpoch(), _closed()),
    ],
    ids=["no-lost-connection", "a-fence-below-it", "a-fence-above-it"],
)
def test_a_sender_death_without_a_lost_connection_or_with_a_fence_is_a_fence(
    cause: Callable[[], BaseException],
) -> None:
    died = _sender_death(cause())
    fenced = asyncio.run(_commit(_Producer([died]))[1].commit({"3": _OFFSETS}))
    assert set(fenced) == {"3"} and not isinstance(fenced["3"], Lost)


class _Starting:
    """A stand-in for aiokafka's producer class whose ``start`` raises the queued errors."""

    errors: list[BaseException] = []
    made: list[_Starting] = []

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.stopped = False
        _Starting.made.append(self)

    async def start(self) -> None:
        if _Starting.errors:
            raise _Starting.errors.pop(0)

    async def stop(self) -> None:
        self.stopped = True


@pytest.mark.parametrize("lost", [True, False], ids=["lost-connection", "other"])
def test_a_producer_whose_coordinator_lookup_lost_its_connection_is_started_anew(
    monkeypatch: pytest.MonkeyPatch, lost: bool
) -> None:
    """aiokafka raises a plain ``KafkaError`` when the broker asked for the coordinator
    dies during ``start``: that is retried with a new producer; other errors are not."""
    import aiokafka

    monkeypatch.setattr(aiokafka, "AIOKafkaProducer", _Starting)
    monkeypatch.setattr(_Starting, "made", [])
    cause = _closed() if lost else KafkaError("UnknownError")
    monkeypatch.setattr(_Starting, "errors", [_chain(KafkaError(repr(cause)), cause)])
    txns = Transactions("g", {"bootstrap_servers": "127.0.0.1:1"})
    if lost:
        asyncio.run(txns.open("3"))
        first, second = _Starting.made
        assert first.stopped and txns.producers["3"] is second and not second.stopped
        assert second.kwargs["transactional_id"] == "g.3"
    else:
        with pytest.raises(KafkaError, match="UnknownError"):
            asyncio.run(txns.open("3"))
        assert len(_Starting.made) == 1 and "3" not in txns.producers
