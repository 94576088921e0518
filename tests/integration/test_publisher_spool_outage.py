"""A 60 s broker outage at 1,000 events/s with the runtime SIGKILLed halfway: nothing is lost.

A runtime subprocess (``tests.fixtures.spool_runtime``) publishes a simulated fleet through
``EventPublisher`` with an on-disk spool. The broker (this test's own) is SIGKILLed a few
seconds in and started again 60 s later; 30 s into the outage the runtime is SIGKILLed
too and restarted on the same spool directory. Afterwards the topic holds every event of
the fleet; copies of an event (re-sent because the crash came before its acknowledgement
was written) are counted and reported; the pipeline drops them by ``eventId``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from prism.devstack import LocalKafka, free_port
from prism.runtime.simulator import FleetConfig, simulate
from tests.fixtures.kafka_io import create_topic
from tests.fixtures.spool_runtime import resume_index

pytestmark = [pytest.mark.integration]

RATE = 1000.0  # events/s offered by the runtime
BEFORE, OUTAGE, KILL_AT = 5.0, 60.0, 30.0  # seconds: flowing, broker down, runtime killed
PARTITIONS = 4
RUNS = 5200  # about 75,000 events: 5 s before, 60 s during, ~10 s after the outage


class Runtime:
    """One runtime subprocess publishing ``events`` with its spool under ``tmp``."""

    def __init__(self, tmp: Path, bootstrap: str, topic: str, name: str) -> None:
        self.tmp, self.name = tmp, name
        self.log = tmp / f"{name}.log"
        self.out = tmp / f"{name}.out"
        cmd = [
            sys.executable, "-m", "tests.fixtures.spool_runtime",
            str(tmp / "events.jsonl"), str(tmp / "progress"),
            "--bootstrap", bootstrap, "--topic", topic, "--spool", str(tmp / "spool"),
            "--rate", str(RATE),
        ]  # fmt: skip
        with open(self.out, "wb") as out, open(self.log, "wb") as err:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL)

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(x) for x in self.out.read_text().splitlines() if x.strip()]

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-20:])


def wait_progress(tmp: Path, index: int, runtime: Runtime, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while resume_index(tmp / "progress") < index:
        assert runtime.proc.poll() is None, f"{runtime.name} exited:\n{runtime.tail()}"
        assert time.monotonic() < deadline, f"{runtime.name} stalled at {index}:\n{runtime.tail()}"
        time.sleep(0.1)


async def _topic(bootstrap: str, topic: str, *, read: bool) -> tuple[int, list[Any]]:
    """(records on ``topic`` by its end offsets, every record when ``read``)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_bytes=16 * 2**20
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        ends = await consumer.end_offsets(tps)
        records: list[Any] = []
        if read:
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            while [tp for tp, end in ends.items() if await consumer.position(tp) < end]:
                for batch in (await consumer.getmany(timeout_ms=1000)).values():
                    records.extend(batch)
        return sum(ends.values()), records
    finally:
        with contextlib.suppress(asyncio.CancelledError):
            await consumer.stop()


def topic_size(bootstrap: str, topic: str) -> int:
    """Records on ``topic``, or -1 while the broker cannot say (it is starting)."""
    try:
        return asyncio.run(_topic(bootstrap, topic, read=False))[0]
    except Exception:
        return -1


@pytest.mark.timeout(240)
def test_a_60s_outage_and_a_killed_runtime_lose_no_event(tmp_path: Path) -> None:
    fleet = simulate(FleetConfig(runs=RUNS, seed=1414))  # no chaos: every record is an event
    events = fleet.events
    (tmp_path / "events.jsonl").write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
    broker = LocalKafka(state_dir=tmp_path / "kafka", port=free_port(), controller_port=free_port())
    broker.up()
    runtimes: list[Runtime] = []
    try:
        topic = "spool-outage.agent-events"
        asyncio.run(create_topic(broker.bootstrap, topic, PARTITIONS))
        first = Runtime(tmp_path, broker.bootstrap, topic, "runtime-1")
        runtimes.append(first)
        wait_progress(tmp_path, int(BEFORE * RATE), first, timeout=60)
        broker.kill()
        down_at, index_at_down = time.monotonic(), resume_index(tmp_path / "progress")

        wait_progress(tmp_path, index_at_down + int(KILL_AT * RATE), first, timeout=KILL_AT + 30)
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait()
        killed_at = resume_index(tmp_path / "progress")
        second = Runtime(tmp_path, broker.bootstrap, topic, "runtime-2")
        runtimes.append(second)

        time.sleep(max(0.0, down_at + OUTAGE - time.monotonic()))
        assert second.proc.poll() is None, second.tail()
        broker.up()
        up_at, backlog = time.monotonic(), resume_index(tmp_path / "progress")
        while topic_size(broker.bootstrap, topic) < backlog:
            assert time.monotonic() - up_at < 90, f"the backlog never arrived:\n{second.tail()}"
            time.sleep(0.5)
        caught_up = time.monotonic() - up_at

        assert second.proc.wait(timeout=120) == 0, second.tail()
        start, final = second.lines()[0], second.lines()[-1]
        _, records = asyncio.run(_topic(broker.bootstrap, topic, read=True))
    finally:
        for r in runtimes:
            if r.proc.poll() is None:
                r.proc.kill()
                r.proc.wait()
        broker.down()

    sent = Counter(orjson.loads(r.value)["eventId"] for r in records)
    wanted = {e["eventId"] for e in events}
    missing, unexpected = wanted - set(sent), set(sent) - wanted
    copies = sum(n - 1 for n in sent.values())
    report = (
        f"{len(events):,} events published at {RATE:,.0f}/s; broker down {OUTAGE:.0f} s; "
        f"runtime killed at event {killed_at:,} and resumed at {start['resumed_at']:,} with "
        f"{start['recovered']:,} events recovered from its spool; {backlog:,} events on the "
        f"topic {caught_up:.1f} s after the broker returned; {len(records):,} records on the "
        f"topic, {copies} duplicate(s) of {sum(n > 1 for n in sent.values())} event(s); "
        f"final stats {final}"
    )
    print(report)
    assert (missing, unexpected) == (set(), set()), report
    assert start["recovered"] > 20_000 and start["resumed_at"] >= killed_at, report
    assert final["complete"] and final["dropped_full"] == final["dropped_never_drop"] == 0, report
    assert final["delivery_failed"] == 0 and final["replayed"] >= start["recovered"], report
    # Copies come only from records delivered but not yet acknowledged in the spool when a
    # process died, or in flight when the broker died: a handful, not a replay of everything.
    assert copies < 0.02 * len(events), report
    # Each run's events reached the topic in publish (seq) order.
    firsts: dict[str, list[int]] = {}
    for r in records:
        ev = orjson.loads(r.value)
        seen = firsts.setdefault(ev["runId"], [])
        if ev["seq"] not in seen:
            seen.append(ev["seq"])
    disordered = [run for run, seqs in firsts.items() if seqs != sorted(seqs)]
    assert disordered == [], f"{len(disordered)} runs out of order, e.g. {disordered[:3]}"
