"""Run ``prism-pipeline worker`` in a subprocess and wait until it has drained its topic.

The demo, the integration tests, the benchmark and the fault-injection suite all need a
real worker in its own process (chDB allows one engine path per process, and a SIGKILL
must hit a real process). Progress is read from Kafka itself: the consumer group's
committed offsets against the topic's end offsets.

Example::

    with WorkerProcess(env={"PRISM_TOPIC_PREFIX": "demo", ...}) as w:
        w.wait_drained("demo.agent-events", "prism-pipeline", timeout=120)
    # the worker got SIGTERM and exited: its chDB ledger can be opened now
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType

from prism.pipeline.retry import DEFAULT_DEADLINE, retry_transient
from prism.pipeline.settings import Settings

from ._kafka import free_port

_DEFAULT_METRICS_PORT = Settings.model_fields["metrics_port"].default

__all__ = [
    "WorkerProcess",
    "committed_lag",
    "committed_positions",
    "group_members",
    "wait_members",
]


async def _positions(bootstrap: str, group: str, topic: str) -> dict[int, tuple[int, int]]:
    """Per partition of ``topic``: (offset committed by ``group`` or 0, end offset)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        await admin.start()
        await consumer.start()
        described = await admin.describe_topics([topic])
        parts = [
            p["partition"]
            for d in described
            if d.get("error_code", 0) == 0
            for p in d.get("partitions", [])
        ]
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        if not tps:
            return {}
        ends = await consumer.end_offsets(tps)
        committed = await admin.list_consumer_group_offsets(group, partitions=tps)
        out = {}
        for tp in tps:
            meta = committed.get(tp)
            out[tp.partition] = (meta.offset if meta is not None and meta.offset >= 0 else 0,
                                 ends[tp])  # fmt: skip
        return out
    finally:
        await consumer.stop()
        await admin.close()


def committed_positions(
    bootstrap: str, group: str, topic: str, *, deadline: float = DEFAULT_DEADLINE
) -> dict[int, tuple[int, int]]:
    """Synchronous per-partition ``(committed offset, end offset)`` of a group on a topic.

    Transient broker errors are retried up to ``deadline`` seconds (``BrokerUnavailable``
    after that).
    """
    return asyncio.run(
        retry_transient(
            lambda: _positions(bootstrap, group, topic),
            what=f"reading the lag of consumer group {group!r} on {topic}",
            bootstrap=bootstrap,
            deadline=deadline,
        )
    )


def committed_lag(
    bootstrap: str, group: str, topic: str, *, deadline: float = DEFAULT_DEADLINE
) -> tuple[int, int]:
    """Synchronous ``(lag, end offsets total)`` of a consumer group on a topic."""
    positions = committed_positions(bootstrap, group, topic, deadline=deadline)
    lag = sum(max(0, end - done) for done, end in positions.values())
    return lag, sum(end for _, end in positions.values())


async def _members(bootstrap: str, group: str) -> int:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        await admin.start()
        responses = await admin.describe_consumer_groups([group])
        groups = [g for r in responses for g in r.to_object()["groups"]]
        return sum(len(g["members"]) for g in groups if g["state"] == "Stable")
    finally:
        await admin.close()


def group_members(bootstrap: str, group: str, *, deadline: float = DEFAULT_DEADLINE) -> int:
    """Members of a consumer group that has settled (state Stable), else 0."""
    return asyncio.run(
        retry_transient(
            lambda: _members(bootstrap, group),
            what=f"describing consumer group {group!r}",
            bootstrap=bootstrap,
            deadline=deadline,
        )
    )


def wait_members(bootstrap: str, group: str, n: int, timeout: float = 120.0) -> None:
    """Wait until ``group`` is stable with ``n`` members (a rebalance finished)."""
    deadline = time.monotonic() + timeout
    seen = 0
    while time.monotonic() < deadline:
        try:
            seen = group_members(bootstrap, group)
        except Exception:
            seen = 0
        if seen == n:
            return
        time.sleep(0.5)
    raise TimeoutError(f"consumer group {group!r} has {seen} stable members, not {n}")


class WorkerProcess:
    """A ``prism-pipeline worker`` subprocess with its log in ``log_path``."""

    def __init__(
        self,
        env: Mapping[str, str],
        *,
        log_path: Path | None = None,
        args: tuple[str, ...] = (),
        faults: str = "",
    ) -> None:
        """``faults`` (a ``prism.devstack.faults`` spec) starts the worker with those faults."""
        self.env = {**os.environ, **env}
        # Several workers share this host: each gets its own /metrics port unless one was
        # chosen (worker_env() always carries the setting, so its default counts as unset).
        if self.env.get("PRISM_METRICS_PORT", "") in ("", str(_DEFAULT_METRICS_PORT)):
            self.env["PRISM_METRICS_PORT"] = str(free_port())
        self.metrics_port = int(self.env["PRISM_METRICS_PORT"])
        self.faults = faults
        self.log_path = log_path or Path(self.env.get("PRISM_STATE_DIR", ".")) / "worker.log"
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> WorkerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115  (owned by the child)
        self.proc = subprocess.Popen(
            self.command(),
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        return self

    def command(self) -> list[str]:
        if self.faults:
            return [sys.executable, "-m", "prism.devstack.faults", self.faults, *self.args]
        return [sys.executable, "-m", "prism.pipeline.cli", "worker", *self.args]

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_drained(
        self,
        topic: str,
        group: str,
        *,
        timeout: float = 180.0,
        settle: float = 2.0,
        min_records: int = 1,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> float:
        """Wait until ``group`` committed every record of ``topic``; return seconds waited.

        ``on_progress(lag, total)`` is called after every poll (e.g. to draw a progress bar).
        Transient broker errors are retried within ``timeout``; then ``BrokerUnavailable``.
        """
        bootstrap = self.env.get("PRISM_KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
        start = time.monotonic()
        drained_since: float | None = None
        lag = -1
        while time.monotonic() - start < timeout:
            if not self.running:
                raise RuntimeError(
                    f"the worker exited with {self.proc and self.proc.returncode}; "
                    f"see {self.log_path}:\n{self.tail_log()}"
                )
            left = max(1.0, timeout - (time.monotonic() - start))
            lag, total = committed_lag(bootstrap, group, topic, deadline=left)
            if on_progress is not None:
                on_progress(lag, total)
            if lag == 0 and total >= min_records:
                drained_since = drained_since or time.monotonic()
                if time.monotonic() - drained_since >= settle:
                    return time.monotonic() - start
            else:
                drained_since = None
            time.sleep(0.5)
        raise TimeoutError(
            f"the worker did not drain {topic} within {timeout:.0f}s "
            f"(lag {lag}); see {self.log_path}:\n{self.tail_log()}"
        )

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM (flush, commit, exit); SIGKILL if it does not exit in time."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL: no flush, no commit (fault injection)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def tail_log(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> WorkerProcess:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
