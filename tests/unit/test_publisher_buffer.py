"""The bounded buffer under each full-buffer policy, flush/close and failures, over a fake sink."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
import pytest

from prism.runtime import DeliveryFailed, EventTooLarge, PublisherClosed, Record
from prism.runtime._buffer import BufferedPublisher, FullPolicy

pytestmark = pytest.mark.timeout(30)


class FakeSink:
    """A sink whose sends block while ``gate`` is closed and whose deliveries we control."""

    def __init__(
        self, *, fail_starts: int = 0, fail_sends: int = 0, auto_deliver: bool = True
    ) -> None:
        self.fail_starts = fail_starts
        self.fail_sends = fail_sends
        self.starts = 0
        self.auto_deliver = auto_deliver
        self.gate = asyncio.Event()
        self.gate.set()
        self.sent: list[Record] = []
        self.pending: list[asyncio.Future[Any]] = []
        self.stopped = False

    async def start(self) -> None:
        self.starts += 1
        if self.fail_starts:
            self.fail_starts -= 1
            raise ConnectionError("broker unreachable")

    async def send(self, record: Record) -> asyncio.Future[Any]:
        await self.gate.wait()
        if self.fail_sends:
            self.fail_sends -= 1
            raise RuntimeError("producer fenced")
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.sent.append(record)
        if self.auto_deliver:
            fut.set_result(None)
        else:
            self.pending.append(fut)
        return fut

    async def stop(self) -> None:
        self.stopped = True

    def seqs(self) -> list[int]:
        return [orjson.loads(r.value)["seq"] for r in self.sent]


def make(
    sink: FakeSink, *, size: int = 3, policy: FullPolicy = "drop", deadline: float = 5.0, **kw: Any
) -> BufferedPublisher:
    return BufferedPublisher(
        sink, buffer_size=size, full_policy=policy, deadline=deadline,
        start_backoff=(0.001, 0.002), **kw,
    )  # fmt: skip


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_drop_policy_counts_drops_and_warns_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sink = FakeSink()
    pub = make(sink, size=3)
    run = pub.run("run-1")
    with caplog.at_level(logging.WARNING, logger="runtime.publisher"):
        results = [run.emit("agent_started", {}) for _ in range(10)]
    assert [r.accepted for r in results] == [True] * 3 + [False] * 7
    stats = pub.stats
    assert (stats.published, stats.dropped_full, stats.buffered) == (3, 7, 3)
    warnings = [r for r in caplog.records if "buffer full" in r.getMessage()]
    assert len(warnings) == 1
    assert await pub.flush(timeout=5) is True
    assert sink.seqs() == [0, 1, 2]  # the dropped seqs 3..9 never reach the sink
    assert (pub.stats.delivered, pub.stats.buffered) == (3, 0)
    await pub.close()


async def test_wait_policy_parks_events_until_room_and_keeps_publish_order() -> None:
    sink = FakeSink()
    sink.gate.clear()
    pub = make(sink, size=2, policy="wait")
    run = pub.run("run-1")
    results = [run.emit("agent_started", {}) for _ in range(5)]
    assert [r.accepted for r in results] == [True, True, None, None, None]
    assert pub.stats.waiting == 3
    sink.gate.set()
    assert await asyncio.gather(*results) == [True] * 5
    assert await pub.flush(timeout=5) is True
    assert sink.seqs() == [0, 1, 2, 3, 4]
    assert (pub.stats.published, pub.stats.dropped_full, pub.stats.waiting) == (5, 0, 0)
    await pub.close()


async def test_wait_policy_drops_and_counts_after_the_deadline() -> None:
    sink = FakeSink()
    sink.gate.clear()
    pub = make(sink, size=2, policy="wait", deadline=0.05)
    run = pub.run("run-1")
    results = [run.emit("agent_started", {}) for _ in range(5)]
    # seq 0 goes to the (stuck) sink, which makes room for seq 2; 3 and 4 wait in vain
    assert await asyncio.gather(*results) == [True, True, True, False, False]
    assert (pub.stats.dropped_full, pub.stats.waiting, pub.stats.published) == (2, 0, 3)
    sink.gate.set()
    assert await pub.flush(timeout=5) is True
    assert sink.seqs() == [0, 1, 2]
    await pub.close()


async def test_flush_returns_only_once_deliveries_are_acknowledged() -> None:
    sink = FakeSink(auto_deliver=False)
    pub = make(sink, size=10)
    run = pub.run("run-1")
    for _ in range(3):
        run.emit("agent_started", {})
    flushing = asyncio.ensure_future(pub.flush(timeout=10))
    await settle()
    assert len(sink.sent) == 3 and not flushing.done()
    assert pub.stats.buffered == 3
    for fut in sink.pending:
        fut.set_result(None)
    assert await flushing is True
    assert (pub.stats.delivered, pub.stats.buffered) == (3, 0)
    await pub.close()


async def test_flush_gives_false_when_the_timeout_passes_first() -> None:
    sink = FakeSink(auto_deliver=False)
    pub = make(sink)
    pub.run("run-1").emit("agent_started", {})
    assert await pub.flush(timeout=0.05) is False
    assert pub.stats.buffered == 1
    sink.pending[0].set_result(None)
    assert await pub.flush(timeout=5) is True


async def test_delivery_failures_are_counted_and_logged_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sink = FakeSink(auto_deliver=False)
    pub = make(sink)
    event_id = pub.run("run-1").emit("agent_started", {}).event["eventId"]
    await settle()
    sink.pending[0].set_exception(TimeoutError("no ack from broker"))
    with caplog.at_level(logging.ERROR, logger="runtime.publisher"):
        assert await pub.flush(timeout=5) is True
    assert (pub.stats.delivery_failed, pub.stats.delivered, pub.stats.buffered) == (1, 0, 0)
    assert any(event_id in r.getMessage() for r in caplog.records)
    await pub.close()


async def test_a_failed_hand_off_is_counted_and_the_sink_replaced() -> None:
    sink = FakeSink(fail_sends=1)
    pub = make(sink, size=10)
    run = pub.run("run-1")
    for _ in range(3):
        run.emit("agent_started", {})
    assert await pub.flush(timeout=10) is True
    assert sink.seqs() == [1, 2]
    assert (pub.stats.delivery_failed, pub.stats.delivered, sink.starts) == (1, 2, 2)
    await pub.close()


async def test_raise_errors_turns_delivery_failures_into_exceptions() -> None:
    sink = FakeSink(auto_deliver=False)
    pub = make(sink, raise_errors=True)
    pub.run("run-1").emit("agent_started", {})
    await settle()
    sink.pending[0].set_exception(TimeoutError("no ack from broker"))
    with pytest.raises(DeliveryFailed, match="1 event") as info:
        await pub.flush(timeout=5)
    assert isinstance(info.value.first_error, TimeoutError)
    assert await pub.flush(timeout=5) is True  # reported once
    await pub.close()


async def test_sink_start_is_retried_with_backoff_until_it_connects(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sink = FakeSink(fail_starts=3)
    pub = make(sink, size=10)
    with caplog.at_level(logging.WARNING, logger="runtime.publisher"):
        for _ in range(5):
            pub.run("run-1").emit("agent_started", {})
        assert await pub.flush(timeout=10) is True
    assert (pub.stats.start_attempts, pub.stats.delivered) == (4, 5)
    assert any("could not connect" in r.getMessage() for r in caplog.records)
    await pub.close()


async def test_close_counts_what_could_not_be_delivered_and_refuses_more() -> None:
    sink = FakeSink()
    sink.gate.clear()
    pub = make(sink, size=3, policy="wait")
    run = pub.run("run-1")
    results = [run.emit("agent_started", {}) for _ in range(5)]
    assert await pub.close(timeout=0.05) is False
    # seqs 0..3 were accepted (0 stuck in the sink freed room for 3); 4 never found room
    stats = pub.stats
    assert (stats.published, stats.dropped_on_close, stats.dropped_full) == (4, 4, 1)
    assert (stats.buffered, stats.waiting, stats.delivered) == (0, 0, 0)
    assert await results[4] is False
    assert sink.stopped
    with pytest.raises(PublisherClosed):
        run.emit("agent_finished", {})


async def test_close_delivers_what_is_buffered() -> None:
    sink = FakeSink()
    async with make(sink, size=100) as pub:
        run = pub.run("run-1")
        for _ in range(50):
            run.emit("agent_started", {})
    assert sink.seqs() == list(range(50))
    assert (pub.stats.delivered, pub.stats.dropped_on_close) == (50, 0)


async def test_draining_a_full_buffer_lets_other_tasks_run() -> None:
    sink = FakeSink()
    pub = make(sink, size=2000)
    run = pub.run("run-1")
    for _ in range(2000):
        run.emit("agent_started", {})
    ticks = 0
    done = False

    async def ticker() -> None:
        nonlocal ticks
        while not done:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.ensure_future(ticker())
    assert await pub.flush(timeout=10) is True
    done = True
    await task
    assert ticks >= 2000 // 256  # the drain task yields between slices of records
    await pub.close()


async def test_oversize_events_never_enter_the_buffer() -> None:
    sink = FakeSink()
    pub = make(sink, max_event_bytes=512)
    with pytest.raises(EventTooLarge):
        pub.run("run-1").emit("agent_denied", {"reason": "x" * 600})
    assert (pub.stats.rejected_oversize, pub.stats.published, pub.stats.buffered) == (1, 0, 0)
    await pub.close()


def test_events_published_before_the_loop_runs_are_delivered_once_it_does() -> None:
    sink = FakeSink()
    pub = make(sink, size=10)
    run = pub.run("run-1")
    assert run.emit("agent_started", {}).accepted is True  # no running loop yet

    async def later() -> bool:
        run.emit("agent_finished", {})
        return await pub.close(timeout=5)

    assert asyncio.run(later()) is True
    assert sink.seqs() == [0, 1]
