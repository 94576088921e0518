"""One event-time watermark across worker processes (schemas/CONTRACT.md rules 10, 16, 17).

Each worker reports every lane it holds (its event-time mark, whether it is idle, its
earliest terminal still waiting to close) twice: to the alerter, in order with the lane's
limit deaths, and to the compacted ``<prefix>.lane-marks`` topic, keyed by lane. Every
worker reads that topic from its beginning with a group-less consumer (``LaneMarks``) and
lets the lanes it does not hold into its ``EventClock`` as remote lanes, so a process
whose own partitions went quiet still sees the pipeline's time move: its stale runs are
marked and its grace periods end on the others' progress, as on the file path, where one
clock sees every partition.

A report says when it was sent; one older than ``REPORT_EXPIRY_S`` is dropped (its owner
stopped, and the lane's next owner reports it), so a worker re-sends an unchanged report
every ``REPORT_HEARTBEAT_S``. Reports are applied to the clock under the worker's lock,
between steps, never while one runs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection
from typing import Any

import orjson

from ..core import EventClock, LaneReport
from ._state import stop_quietly

__all__ = ["REPORT_EXPIRY_S", "REPORT_HEARTBEAT_S", "LaneMarks", "decode_lane_mark"]

log = logging.getLogger("prism.worker")

REPORT_EXPIRY_S = 60.0  # a report older than this no longer counts (its owner stopped)
REPORT_HEARTBEAT_S = 20.0  # an unchanged report is sent again this often
_POLL_MS = 500


def decode_lane_mark(raw: bytes | None) -> tuple[int, LaneReport, float] | None:
    """A ``lane-marks`` record's lane, report and send time (None: not a lane report)."""
    try:
        d = orjson.loads(raw or b"{}")
        report = LaneReport(int(d["mark"]), d["pending"], bool(d["idle"]), bool(d["quiet"]))
        return int(d["lane"]), report, float(d["at"])
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


class LaneMarks:
    """The latest report of every lane of the pipeline, read from the lane-marks topic."""

    def __init__(self, topic: str, consumer_kwargs: dict[str, Any]) -> None:
        self.topic = topic
        self.kwargs = consumer_kwargs
        self.latest: dict[int, tuple[LaneReport, float]] = {}  # lane -> (report, sent at)
        self.copies: dict[int, int] = {}  # lane -> its repartition position, last reported
        self._consumer: Any = None

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
                batch = await self._consumer.getmany(timeout_ms=_POLL_MS)
                for records in batch.values():
                    for rec in records:
                        self.take(rec.value)
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
        """Let the lanes this process does not hold (``held``) into ``clock``, dropping
        reports older than ``REPORT_EXPIRY_S``."""
        for lane, (report, at) in self.latest.items():
            if lane in held or now - at > REPORT_EXPIRY_S:
                clock.forget_remote(lane)
            else:
                clock.remote(lane, report.mark_us, report.idle)

    async def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        await stop_quietly(consumer, "lane-marks reader")
