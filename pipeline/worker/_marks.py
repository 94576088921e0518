"""One event-time watermark across worker processes (schemas/CONTRACT.md rules 10, 16, 17).

Each worker reports every lane it holds (its event-time mark, whether it is idle, its
earliest terminal still waiting to close) twice: to the alerter, in order with the lane's
limit deaths, and to the compacted ``<prefix>.lane-marks`` topic, keyed by lane. Every
worker reads that topic from its beginning with a group-less consumer (``LaneMarks``) and
lets the lanes it does not hold into its ``EventClock`` as remote lanes, so a process
whose own partitions went quiet still sees the pipeline's time move: its stale runs are
marked and its grace periods end on the others' progress, as on the file path, where one
clock sees every partition.

A report says when it was sent, and a worker re-sends an unchanged one every
``heartbeat_s`` (a third of the consumer session timeout). A lane's report stays until a
newer one replaces it: a lane whose owner stopped keeps holding the watermark at its last
mark until its next owner reports it, since its records are still to come. An *idle*
report older than the session timeout is no longer believed idle (its owner may have
stopped while records arrived) and holds the watermark at its mark like a lane reading.
Reports are applied to the clock under the worker's lock, between steps, never while one
runs. A process that just started steps nothing until it has read the topic to the end
offset it found (``wait_caught_up``): until then it would not know the lanes that hold the
watermark back and would decide past them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection
from typing import Any

import orjson

from ..core import EventClock, LaneReport
from ._state import stop_quietly

__all__ = ["LaneMarks", "decode_lane_mark", "heartbeat_s"]

log = logging.getLogger("prism.worker")

_POLL_MS = 500


def heartbeat_s(session_timeout_s: float) -> float:
    """How often an unchanged report is sent again: three times per session timeout, so a
    live idle lane's report never ages past it."""
    return max(0.5, session_timeout_s / 3)


def decode_lane_mark(raw: bytes | None) -> tuple[int, LaneReport, float] | None:
    """A ``lane-marks`` record's lane, report and send time (None: not a lane report)."""
    try:
        d = orjson.loads(raw or b"{}")
        hold = d.get("hold")
        report = LaneReport(
            int(d["mark"]),
            d["pending"],
            bool(d["idle"]),
            bool(d["quiet"]),
            int(hold) if hold is not None else None,
        )
        return int(d["lane"]), report, float(d["at"])
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


class LaneMarks:
    """The latest report of every lane of the pipeline, read from the lane-marks topic."""

    def __init__(
        self, topic: str, consumer_kwargs: dict[str, Any], *, idle_expiry_s: float = 10.0
    ) -> None:
        self.topic = topic
        self.kwargs = consumer_kwargs
        self.idle_expiry_s = idle_expiry_s
        self.latest: dict[int, tuple[LaneReport, float]] = {}  # lane -> (report, sent at)
        self.copies: dict[int, int] = {}  # lane -> its repartition position, last reported
        self.caught_up = asyncio.Event()  # the topic was read to the end offset found first
        self._target: int | None = None  # that end offset
        self._consumer: Any = None

    async def wait_caught_up(self, timeout_s: float) -> bool:
        """Wait until the reader reached the topic's end (as found when it started);
        False when ``timeout_s`` passed first (a broker away: the caller goes on)."""
        try:
            await asyncio.wait_for(self.caught_up.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    async def run(self, stopping: Callable[[], bool]) -> None:
        """Follow the topic until ``stopping()``; broker errors are retried with backoff."""
        from aiokafka import AIOKafkaConsumer, TopicPartition

        delay = 0.5
        while not stopping():
            try:
                if self._consumer is None:
                    self._consumer = AIOKafkaConsumer(
                        group_id=None,
                        enable_auto_commit=False,
                        isolation_level="read_committed",
                        **self.kwargs,
                    )
                    await self._consumer.start()
                    tp = TopicPartition(self.topic, 0)
                    self._consumer.assign([tp])
                    await self._consumer.seek_to_beginning(tp)
                    if self._target is None:
                        self._target = (await self._consumer.end_offsets([tp]))[tp]
                batch = await self._consumer.getmany(timeout_ms=_POLL_MS)
                for records in batch.values():
                    for rec in records:
                        self.take(rec.value)
                if not self.caught_up.is_set() and self._target is not None:
                    position = await self._consumer.position(TopicPartition(self.topic, 0))
                    if position >= self._target:
                        self.caught_up.set()
                delay = 0.5
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a busy or restarting broker: try again
                log.debug("lane-marks reader: %s; retrying in %.1fs", exc, delay)
                await self.close()
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)

    def take(self, raw: bytes | None) -> None:
        """Keep one record's report (a later one of its lane replaces it)."""
        decoded = decode_lane_mark(raw)
        if decoded is not None:
            lane, report, at = decoded
            self.latest[lane] = (report, at)
            copies = orjson.loads(raw or b"{}").get("copies")
            if isinstance(copies, int):
                self.copies[lane] = copies

    def apply(self, clock: EventClock, held: Collection[int], now: float) -> None:
        """Let the lanes this process does not hold (``held``) into ``clock``; an idle
        report older than ``idle_expiry_s`` counts as a lane still reading."""
        for lane, (report, at) in self.latest.items():
            if lane in held:
                clock.forget_remote(lane)
            else:
                idle = report.idle and now - at <= self.idle_expiry_s
                clock.remote(lane, report.mark_us, idle, report.hold_us)

    async def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        await stop_quietly(consumer, "lane-marks reader")
