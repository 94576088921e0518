"""Tail one channel operation from ``prism.channel-operations``: its transitions in ``seq`` order.

``OperationSequencer`` (pure) releases an operation's records contiguously from seq 0, each
``eventId`` and each ``seq`` once, and knows when the operation ended: a final state
(``delivered``, ``notice_delivered``, ``cancelled``, ``reconciled``, or a standalone
``denied`` / ``duplicate``) with every lower seq released. ``delivery_unknown`` and
``execution_unknown`` are not an end: they wait for a host reconcile. ``tail_operation``
reads the operation's partition (key = operationId) without a consumer group.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import orjson
from aiokafka import TopicPartition

from prism.schemas import (
    CHANNEL_FINAL_STATES,
    ChannelOperation,
    ContractViolation,
    event_to_wire,
    parse_channel_operation,
)

from ..settings import Settings
from ._sequencer import format_seqs
from ._tail import _consumer, partition_for, records_until, topic_partitions

__all__ = ["OperationResult", "OperationSequencer", "format_operation", "tail_operation"]


@dataclass(slots=True)
class OperationResult:
    """How a tail of one operation ended: complete (a final state), or where it stopped."""

    operation_id: str
    complete: bool
    state: str | None  # the last state released
    missing: list[tuple[int, int]]  # seqs below the highest seen that never arrived
    printed: int
    duplicates: int
    invalid: int = 0

    def describe(self) -> str:
        """One line for stderr."""
        if self.complete:
            return f"operation {self.operation_id}: {self.state}, {self.printed} transitions"
        gaps = format_seqs(self.missing) if self.missing else "none"
        return (
            f"operation {self.operation_id}: not finished, last state {self.state or 'none'}; "
            f"missing seqs: {gaps}; {self.printed} transitions printed"
        )


class OperationSequencer:
    """Buffers an operation's out-of-order records and releases the contiguous prefix.

    Example::

        seq = OperationSequencer("op-81")
        for op in records:                 # any order, duplicates allowed
            for ready in seq.push(op):
                print(ready.seq, ready.state)
        seq.complete                       # a final state reached, nothing below it missing
    """

    def __init__(self, operation_id: str) -> None:
        self.operation_id = operation_id
        self.next_seq = 0
        self.state: str | None = None
        self.duplicates = 0
        self.released = 0
        self._buffer: dict[int, ChannelOperation] = {}
        self._event_ids: set[str] = set()

    @property
    def complete(self) -> bool:
        return self.state in CHANNEL_FINAL_STATES

    def push(self, op: ChannelOperation) -> list[ChannelOperation]:
        """Accept one record of the operation; return the records now releasable, in order."""
        if op.operation_id != self.operation_id or self.complete:
            return []
        if op.event_id in self._event_ids or op.seq in self._buffer or op.seq < self.next_seq:
            self.duplicates += 1
            return []
        self._event_ids.add(op.event_id)
        self._buffer[op.seq] = op
        out = []
        while self.next_seq in self._buffer and not self.complete:
            ready = self._buffer.pop(self.next_seq)
            self.next_seq += 1
            self.state = ready.state
            self.released += 1
            out.append(ready)
        return out

    def result(self, invalid: int = 0) -> OperationResult:
        top = max(self._buffer, default=self.next_seq - 1)
        missing = _ranges(s for s in range(self.next_seq, top) if s not in self._buffer)
        return OperationResult(
            self.operation_id,
            self.complete,
            self.state,
            missing,
            self.released,
            self.duplicates,
            invalid,
        )


def _ranges(seqs: Iterable[int]) -> list[tuple[int, int]]:
    """Ascending seqs as inclusive ranges."""
    out: list[tuple[int, int]] = []
    for s in seqs:
        if out and out[-1][1] == s - 1:
            out[-1] = (out[-1][0], s)
        else:
            out.append((s, s))
    return out


def format_operation(op: ChannelOperation, fmt: str) -> str:
    """``jsonl``: the record as one JSON line; ``pretty``: seq, time, state, reason, connection."""
    if fmt == "jsonl":
        return orjson.dumps(event_to_wire(op)).decode()
    reason = f" ({op.reason})" if op.reason else ""
    run = f" run={op.run_id}" if op.run_id else ""
    return f"{op.seq:>3} {op.ts.isoformat()} {op.state}{reason} {op.connection_id}{run}"


async def tail_operation(
    settings: Settings,
    operation_id: str,
    on_record: Callable[[ChannelOperation], None],
    *,
    timeout: float | None = 60.0,
) -> OperationResult:
    """Print-as-you-go replay of one operation from the channel topic, ending on a final state.

    Example::

        result = await tail_operation(load_settings(), "op-81", lambda op: print(op.state))
        result.complete, result.state
    """
    topic = settings.topics.channel_operations
    partitions = await topic_partitions(settings, topic)
    tp = TopicPartition(topic, partitions[partition_for(operation_id, len(partitions))])
    key = operation_id.encode()
    seq = OperationSequencer(operation_id)
    invalid = 0
    consumer = _consumer(settings)
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        async for rec in records_until(consumer, tp, lambda: seq.complete, timeout):
            if rec.key != key:
                continue
            try:
                op = parse_channel_operation(rec.value or b"", max_bytes=settings.max_event_bytes)
            except ContractViolation:
                invalid += 1
                continue
            for ready in seq.push(op):
                on_record(ready)
    finally:
        await consumer.stop()
    return seq.result(invalid)
