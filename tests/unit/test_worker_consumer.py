"""The consumer boundary's ``positions`` (``pipeline/worker/_consumer.py``): the worker's
tick asks it for every held partition at once, and it must not wait on one whose position
is still being reset (aiokafka's ``position`` waits until one is known)."""

from __future__ import annotations

import asyncio

from aiokafka import TopicPartition
from aiokafka.errors import IllegalStateError

from pipeline.worker._consumer import KafkaGroupConsumer

KNOWN = TopicPartition("in", 0)
RESETTING = [TopicPartition("in", 1), TopicPartition("in.repartition", 1)]
GONE = TopicPartition("in", 2)


class _AiokafkaConsumer:
    """``position`` as aiokafka's behaves: at once when known, raises when the partition
    is not assigned, else waits until a position is known (here: never)."""

    def __init__(self) -> None:
        self.waiting = 0
        self.most_waiting = 0
        self.cancelled = 0

    async def position(self, tp: TopicPartition) -> int:
        if tp == KNOWN:
            return 42
        if tp == GONE:
            raise IllegalStateError(f"Partition {tp} is not assigned")
        self.waiting += 1
        self.most_waiting = max(self.most_waiting, self.waiting)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.waiting -= 1
        raise AssertionError("unreachable")


def _consumer_with(fake: _AiokafkaConsumer) -> KafkaGroupConsumer:
    c = KafkaGroupConsumer("g", {})
    c._consumer = fake  # the client start() would make
    return c


def test_positions_leave_out_the_unknown_and_wait_for_them_together_once() -> None:
    fake = _AiokafkaConsumer()
    c = _consumer_with(fake)

    got = asyncio.run(c.positions([KNOWN, *RESETTING, GONE]))

    assert got == {KNOWN: 42}
    assert fake.most_waiting == len(RESETTING)  # asked side by side, not one wait each
    assert fake.cancelled == len(RESETTING) and fake.waiting == 0  # nothing left running


def test_positions_of_nothing_or_before_start_are_empty() -> None:
    assert asyncio.run(KafkaGroupConsumer("g", {}).positions([KNOWN])) == {}
    assert asyncio.run(_consumer_with(_AiokafkaConsumer()).positions([])) == {}
