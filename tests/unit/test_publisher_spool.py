"""The publisher with a spool: outages fill the disk, restarts replay in order, never-drop events.

A scripted sink stands in for Kafka: it can refuse to connect (broker down), fail
deliveries with a retriable error (broker lost mid-stream) or a permanent one, and
records what it was handed, so order, duplicates and losses are visible.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka.errors import KafkaConnectionError, MessageSizeTooLargeError

from prism.runtime import EventPublisher, Record, SpoolError
from prism.runtime._buffer import BufferedPublisher
from prism.runtime._spool import Spool

pytestmark = pytest.mark.timeout(60)


class ScriptedSink:
    """Connects only while ``up``; ``fail_next`` deliveries fail with ``failure``.

    With ``broken`` every delivery fails until the next ``start()``, as a producer whose
    connection died: the idempotent producer never lets a later record of a partition
    overtake a failed one.
    """

    def __init__(self, *, up: bool = True) -> None:
        self.up = up
        self.fail_next = 0
        self.broken = False
        self.starts = 0
        self.failure: BaseException = KafkaConnectionError("broker gone")
        self.handed: list[int] = []  # seq of every record handed over, in order
        self.delivered: list[int] = []

    async def start(self) -> None:
        if not self.up:
            raise ConnectionError("broker unreachable")
        self.starts += 1
        self.broken = False

    async def send(self, record: Record) -> asyncio.Future[Any]:
        seq = orjson.loads(record.value)["seq"]
        self.handed.append(seq)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.fail_next or self.broken:
            self.fail_next = max(0, self.fail_next - 1)
            fut.set_exception(self.failure)
        else:
            self.delivered.append(seq)
            fut.set_result(None)
        return fut

    async def stop(self) -> None:
        pass


def publisher(
    sink: ScriptedSink, spool_dir: Path, *, size: int = 5, max_bytes: int = 1 << 20, **kw: Any
) -> BufferedPublisher:
    spool = Spool(spool_dir, max_bytes=max_bytes, segment_bytes=4096, fsync="never")
    return BufferedPublisher(sink, buffer_size=size, spool=spool, start_backoff=(0.005, 0.01), **kw)


def usage(run: Any, turn: int) -> Any:
    return run.emit(
        "usage_recorded",
        {
            "scope": "provider_turn",
            "turn": turn,
            "attempt": 1,
            "usage": {"inputTokens": 10, "outputTokens": 2},
        },
    )


async def test_an_outage_fills_the_spool_not_the_drop_counter(tmp_path: Path) -> None:
    sink = ScriptedSink(up=False)
    pub = publisher(sink, tmp_path, size=5)
    run = pub.run("run-1")
    results = [run.emit("agent_started", {}) for _ in range(300)]
    assert all(r.accepted for r in results)
    await asyncio.sleep(0.05)
    s = pub.stats
    assert (s.published, s.spooled, s.dropped_full) == (300, 300, 0)
    assert (s.buffered, s.delivered) == (300, 0)
    assert s.spool_bytes > 300 * 100
    sink.up = True
    assert await pub.flush(timeout=10) is True
    assert sink.delivered == list(range(300))  # in publish order, each once
    s = pub.stats
    assert (s.delivered, s.buffered, s.replayed) == (300, 0, 295)  # 5 fitted in memory
    await pub.close()
    assert pub.stats.spool_bytes == 0  # delivered segments were deleted
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ack", "lock"]


async def test_the_drop_policy_applies_only_once_the_spool_is_full(tmp_path: Path) -> None:
    sink = ScriptedSink(up=False)
    pub = publisher(sink, tmp_path, size=5, max_bytes=16 * 1024)
    run = pub.run("run-1")
    results = [run.emit("agent_started", {}) for _ in range(200)]
    taken = sum(bool(r.accepted) for r in results)
    assert 50 < taken < 200 and all(r.accepted for r in results[:taken])
    s = pub.stats
    assert (s.published, s.dropped_full) == (taken, 200 - taken)
    assert s.spool_bytes <= 16 * 1024
    sink.up = True
    assert await pub.flush(timeout=10) is True
    assert sink.delivered == list(range(taken))
    assert run.emit("agent_started", {}).accepted is True  # room again
    await pub.close()


async def test_never_drop_events_wait_for_room_while_others_are_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sink = ScriptedSink(up=False)
    pub = publisher(
        sink, tmp_path, max_bytes=12 * 1024, never_drop={"usage_recorded"}, never_drop_deadline=5
    )
    run = pub.run("run-1")
    while run.emit("agent_started", {}).accepted:
        pass
    dropped = pub.stats.dropped_full
    parked = [usage(run, t) for t in (1, 2)]
    assert [r.accepted for r in parked] == [None, None]
    assert (pub.stats.waiting, pub.stats.dropped_full) == (2, dropped)
    sink.up = True  # the broker is back: the spool drains and makes room
    assert await asyncio.gather(*parked) == [True, True]
    assert await pub.flush(timeout=10) is True
    usage_seqs = [p.event["seq"] for p in parked]
    assert sink.delivered[-2:] == usage_seqs
    assert (pub.stats.dropped_never_drop, pub.stats.waiting) == (0, 0)
    await pub.close()


async def test_a_never_drop_event_past_its_deadline_is_counted_apart_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sink = ScriptedSink(up=False)
    pub = publisher(
        sink, tmp_path, max_bytes=12 * 1024, never_drop={"usage_recorded"},
        never_drop_deadline=0.1,
    )  # fmt: skip
    run = pub.run("run-1")
    while run.emit("agent_started", {}).accepted:
        pass
    with caplog.at_level(logging.ERROR, logger="runtime.publisher"):
        lost = usage(run, 1)
        assert await lost is False
    assert pub.stats.dropped_never_drop == 1
    assert any(
        lost.event["eventId"] in r.getMessage() and "never-drop" in r.getMessage()
        for r in caplog.records
    )
    await pub.close(timeout=0.1)


async def test_never_drop_works_without_a_spool_too() -> None:
    sink = ScriptedSink(up=False)
    pub = BufferedPublisher(
        sink, buffer_size=2, never_drop={"usage_recorded"}, never_drop_deadline=5,
        start_backoff=(0.005, 0.01),
    )  # fmt: skip
    run = pub.run("run-1")
    assert [run.emit("agent_started", {}).accepted for _ in range(3)] == [True, True, False]
    parked = usage(run, 1)
    assert parked.accepted is None
    sink.up = True
    assert await parked is True
    assert await pub.flush(timeout=5) is True
    assert sink.delivered == [0, 1, 3]  # seq 2 was dropped under the "drop" policy
    await pub.close()


async def test_what_close_could_not_deliver_is_sent_by_the_next_publisher(tmp_path: Path) -> None:
    down = ScriptedSink(up=False)
    first = publisher(down, tmp_path)
    run = first.run("run-1")
    for _ in range(40):
        run.emit("agent_started", {})
    assert await first.close(timeout=0.05) is False
    assert (first.stats.dropped_on_close, first.stats.buffered) == (0, 40)

    sink = ScriptedSink()
    second = publisher(sink, tmp_path)
    assert (second.stats.recovered, second.stats.buffered) == (40, 40)
    await second.start()
    later = second.run("run-2")
    later.emit("agent_started", {})  # a new event goes after the recovered ones
    assert await second.flush(timeout=10) is True
    assert sink.delivered == [*range(40), 0]
    s = second.stats
    assert (s.delivered, s.buffered, s.replayed, s.published) == (41, 0, 41, 1)
    await second.close()
    third = publisher(ScriptedSink(), tmp_path)
    assert third.stats.recovered == 0  # nothing is sent twice by a clean successor
    await third.close()


async def test_a_broker_lost_mid_stream_means_resending_from_the_spool_not_losing(
    tmp_path: Path,
) -> None:
    sink = ScriptedSink()
    pub = publisher(sink, tmp_path, size=1000)
    run = pub.run("run-1")
    for _ in range(10):
        run.emit("agent_started", {})
    assert await pub.flush(timeout=5) is True
    sink.broken = True  # the connection died: every hand-off fails until a new producer
    for _ in range(40):
        run.emit("agent_started", {})
    assert await pub.flush(timeout=10) is True
    assert sink.delivered == list(range(50))  # nothing lost, nothing doubled, in order
    assert len(sink.handed) > 50 and sink.starts == 2  # failed hand-offs, then a new producer
    s = pub.stats
    assert (s.delivered, s.delivery_failed, s.buffered) == (50, 0, 0)
    assert s.retried == 1 and s.replayed == 40  # one rewind, the 40 read back from disk
    await pub.close()


async def test_deliveries_that_succeeded_before_a_rewind_are_not_sent_again(
    tmp_path: Path,
) -> None:
    sink = ScriptedSink()
    pub = publisher(sink, tmp_path, size=1000)
    run = pub.run("run-1")
    sink.fail_next = 3  # three records of one partition fail, later ones (others) get through
    for _ in range(20):
        run.emit("agent_started", {})
    assert await pub.flush(timeout=10) is True
    assert sorted(sink.delivered) == list(range(20))  # each exactly once
    assert (pub.stats.delivered, pub.stats.retried) == (20, 1)
    await pub.close()


async def test_a_record_the_broker_refuses_for_good_is_counted_and_skipped(
    tmp_path: Path,
) -> None:
    sink = ScriptedSink()
    sink.fail_next, sink.failure = 1, MessageSizeTooLargeError("too large for the topic")
    pub = publisher(sink, tmp_path)
    run = pub.run("run-1")
    for _ in range(3):
        run.emit("agent_started", {})
    assert await pub.flush(timeout=5) is True
    assert sink.delivered == [1, 2]
    assert (pub.stats.delivery_failed, pub.stats.retried, pub.stats.buffered) == (1, 0, 0)
    await pub.close()


_CRASHING_RUNTIME = """
import asyncio, sys
from prism.runtime._buffer import BufferedPublisher
from prism.runtime._spool import Spool

class Down:
    async def start(self): raise ConnectionError("broker down")
    async def send(self, record): raise AssertionError("never connected")
    async def stop(self): pass

async def main():
    spool = Spool(sys.argv[1], max_bytes=1 << 24, segment_bytes=4096, fsync="never")
    pub = BufferedPublisher(Down(), buffer_size=10, spool=spool, start_backoff=(0.01, 0.02))
    run = pub.run("run-1")
    for _ in range(500):
        run.emit("agent_started", {})
    print("published", flush=True)
    await asyncio.sleep(60)

asyncio.run(main())
"""


async def test_a_killed_runtime_loses_nothing_it_published_even_with_a_torn_tail(
    tmp_path: Path,
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _CRASHING_RUNTIME, str(tmp_path)], stdout=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stdout.readline() == b"published\n"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    last = sorted(tmp_path.glob("*.seg"))[-1]
    with open(last, "ab") as f:
        f.write(b"\x00\x00\x01\x00torn")  # as if killed inside a write
    sink = ScriptedSink()
    pub = publisher(sink, tmp_path)
    assert (pub.stats.recovered, pub.stats.spool_corrupt) == (500, 1)
    await pub.start()
    assert await pub.flush(timeout=10) is True
    assert sink.delivered == list(range(500))
    await pub.close()


def test_event_publisher_takes_the_spool_settings_and_guards_the_directory(
    tmp_path: Path,
) -> None:
    pub = EventPublisher(
        "127.0.0.1:1", spool_dir=tmp_path / "spool", spool_max_bytes=1 << 20,
        spool_segment_bytes=1 << 16, fsync="always", never_drop={"usage_recorded"},
    )  # fmt: skip
    assert "spool_dir=" in repr(pub) and pub.never_drop == {"usage_recorded"}
    with pytest.raises(SpoolError, match="in use by another publisher"):
        EventPublisher("127.0.0.1:1", spool_dir=tmp_path / "spool")
    with pytest.raises(SpoolError, match="fsync must be"):
        EventPublisher("127.0.0.1:1", spool_dir=tmp_path / "other", fsync="often")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="never_drop must be a collection"):
        EventPublisher("127.0.0.1:1", never_drop="usage_recorded")
    asyncio.run(pub.close(timeout=0.01))
