"""The fault-injection suite's machinery: workers in subprocesses, own brokers, one-shot oracle.

No tests live here; ``test_faults*.py`` import ``FaultLab`` and the helpers. A ``FaultLab``
owns every worker and broker it starts and stops them in ``close()`` (the tests' fixtures
call it even when a test fails). Ledger facts are read in one child process per look
(``ledger_report``), since a chDB engine path belongs to one process at a time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from prism.devstack import LocalKafka, free_port
from prism.devstack.workerproc import WorkerProcess, committed_lag, committed_positions
from prism.pipeline.settings import Settings, load_settings
from prism.pipeline.topics import ensure_topics, worker_env
from prism.runtime.simulator import Fleet, FleetRecord, publish_to_kafka
from tests.fixtures.oracle import diff_manifest

# A SIGKILLed member leaves the group after 6 s (the broker's minimum session timeout)
# instead of the worker's default 10 s.
FAST_GROUP_ENV = {"PRISM_CONSUMER_SESSION_TIMEOUT_SECONDS": "6"}
CHAOS: dict[str, Any] = dict(
    duplicates=0.05,
    reorder_window=3,
    post_terminal=0.04,
    conflicting_terminals=0.03,
    malformed=0.02,
    oversized=0.004,
)
_CRASH = re.compile(r"Crashed reason=.*")
_FAULT = re.compile(r"^prism-fault: (.*)$", re.MULTILINE)


class FaultLab:
    """Settings, topics, publishing, workers and brokers of one test; ``close`` stops them all."""

    def __init__(self, bootstrap: str, prefix: str, tmp: Path) -> None:
        self.bootstrap = bootstrap
        self.prefix = prefix
        self.tmp = tmp
        self.workers: list[WorkerProcess] = []
        self.brokers: list[LocalKafka] = []

    def settings(
        self,
        name: str,
        *,
        group: str | None = None,
        ledger: str | None = None,
        store: str = "memory",
        bootstrap: str | None = None,
        **overrides: Any,
    ) -> Settings:
        """Worker settings: state under ``tmp/name``; group and ledger shared when named.

        Progress samples are off unless asked for: the fault specs count ledger flushes,
        and a timer flush of samples alone must not be the one a fault strikes.
        """
        (self.tmp / (ledger or name)).mkdir(parents=True, exist_ok=True)  # the chDB parent
        overrides.setdefault("progress_interval_seconds", 0.0)
        return load_settings(
            kafka_bootstrap_servers=bootstrap or self.bootstrap,
            topic_prefix=self.prefix,
            consumer_group=f"{self.prefix}-{group or 'group'}",
            clickhouse_dsn=f"chdb://{self.tmp / (ledger or name) / 'ledger'}",
            state_dir=self.tmp / name / "state",
            state_store=store,
            grace_period_seconds=1.0,
            batch_max_events=500,
            batch_max_seconds=0.3,
            **overrides,
        )

    def publish(
        self, fleet: Fleet, settings: Settings, records: list[FleetRecord] | None = None
    ) -> None:
        sub = fleet if records is None else dataclasses.replace(fleet, records=records)
        asyncio.run(ensure_topics(settings))
        asyncio.run(
            publish_to_kafka(
                sub, settings.kafka_bootstrap_servers, settings.topics.input, progress=False
            )
        )

    def worker(self, settings: Settings, name: str, *, faults: str = "") -> WorkerProcess:
        """Start a worker with ``faults`` (a fault spec), logging to ``name.log``."""
        env = {**worker_env(settings), **FAST_GROUP_ENV}
        w = WorkerProcess(env, log_path=self.tmp / f"{name}.log", faults=faults)
        self.workers.append(w)
        return w.start()

    def drain(
        self, w: WorkerProcess, settings: Settings, *, timeout: float = 120.0, settle: float = 3.0
    ) -> None:
        """Wait until ``settings``' group committed the whole input topic; fail fast on a crash.

        ``settle``: how long the lag must stay 0, so that runs waiting out the 1 s grace
        period get closed by the worker's 1 s timer before the test looks.
        """
        deadline = time.monotonic() + timeout
        since: float | None = None
        while time.monotonic() < deadline:
            crash = _CRASH.search(w.log_path.read_text(errors="replace"))
            if crash or not w.running:
                raise AssertionError(
                    f"worker {w.log_path.name} failed "
                    f"({crash[0] if crash else 'exited'}):\n{self.tails()}"
                )
            try:
                lag, total = committed_lag(
                    settings.kafka_bootstrap_servers, settings.consumer_group, settings.topics.input
                )
            except Exception:  # the group is not there yet
                lag, total = 1, 0
            if lag == 0 and total > 0:
                since = since or time.monotonic()
                if time.monotonic() - since >= settle:
                    return
            else:
                since = None
            time.sleep(0.5)
        try:
            positions = committed_positions(
                settings.kafka_bootstrap_servers, settings.consumer_group, settings.topics.input
            )
            behind = {p: f"{done}/{end}" for p, (done, end) in positions.items() if done < end}
        except Exception as exc:
            behind = {"unknown": repr(exc)}
        raise AssertionError(
            f"{w.log_path.name} did not drain {settings.topics.input} in "
            f"{timeout:.0f}s (lag {lag}; committed/end of lagging partitions {behind}):\n"
            f"{self.tails()}"
        )

    def tails(self, lines: int = 30) -> str:
        """Every worker's state, last log lines and stats file: a stall can be any one's."""
        parts = []
        for w in self.workers:
            state = "running" if w.running else f"exited {w.proc.returncode if w.proc else None}"
            stats = Path(w.env.get("PRISM_STATE_DIR", ".")) / "worker-stats.json"
            counts = stats.read_text()[:1500] if stats.exists() else "(no stats file)"
            try:  # table-like lines of libraries crowd out the lines that say what happened
                text = w.log_path.read_text(errors="replace").splitlines()
            except OSError:
                text = ["(no log)"]
            kept = [line for line in text if not line.startswith(("|", "+"))]
            parts.append(
                f"--- {w.log_path.name} ({state}):\n" + "\n".join(kept[-lines:]) + "\n"
                f"--- {w.log_path.name} stats: {counts}"
            )
        return "\n".join(parts)

    def wait_killed(self, w: WorkerProcess, timeout: float = 90.0) -> list[str]:
        """Wait for the injected SIGKILL; return the worker's ``prism-fault`` lines."""
        assert w.proc is not None
        try:
            code = w.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"the fault never fired in {timeout:.0f}s:\n{w.tail_log(30)}"
            ) from None
        assert code == -signal.SIGKILL, f"exit {code}, not SIGKILL:\n{w.tail_log(30)}"
        return fault_lines(w)

    def broker(self) -> LocalKafka:
        """A broker of this test's own (a fixed port pair, so it can restart on its state)."""
        b = LocalKafka(state_dir=self.tmp / "kafka", port=free_port(), controller_port=free_port())
        self.brokers.append(b)
        b.up()
        return b

    def close(self) -> None:
        for w in self.workers:
            w.stop(timeout=20)
        for b in self.brokers:
            b.down()


def fault_lines(w: WorkerProcess) -> list[str]:
    return _FAULT.findall(w.log_path.read_text(errors="replace"))


@dataclasses.dataclass
class LedgerReport:
    """What one look at a ledger saw (see ``_REPORT``)."""

    snapshot: dict[str, Any]  # tests.fixtures.oracle.snapshot
    contents: dict[str, list[tuple[Any, ...]]]  # tests.fixtures.ledger_compare.ledger_contents
    alerts: list[tuple[str, str, str]]  # (alert_id, rule, state)
    events: int  # rows of the run_events view
    event_ids: set[str]
    stored_offsets: dict[int, int]  # input partition -> highest offset in run_events_store
    dead_letters: dict[tuple[int, int], tuple[str, str, str]]  # (p, offset) -> code, reason, sha

    def problems(self, manifest: dict[str, Any]) -> list[str]:
        """Every disagreement with the manifest, including lost or doubled raw events."""
        out = diff_manifest(self.snapshot, manifest)
        want = manifest["counts"]["applied_events"]
        if (self.events, len(self.event_ids)) != (want, want):
            out.append(
                f"run_events holds {self.events} rows of {len(self.event_ids)} event ids; "
                f"expected {want} applied events, each once"
            )
        return out


_REPORT = """
import pickle, sys
from prism import sinks
from tests.fixtures.oracle import client_query, snapshot
from tests.fixtures.ledger_compare import ledger_contents
dsn, topic, out = sys.argv[1:4]
client = sinks.connect(dsn, "prism")
q = client_query(client)
ids = [r[0] for r in client.query("SELECT event_id FROM prism.run_events").result_rows]
stored = client.query("SELECT partition, max(offset) FROM prism.run_events_store "
                      "WHERE source = {t:String} GROUP BY partition", parameters={"t": topic})
dead = client.query("SELECT partition, offset, code, reason, sha256 "
                    "FROM prism.dead_letters WHERE source = {t:String}", parameters={"t": topic})
alerts = client.query("SELECT alert_id, rule, state FROM prism.alerts").result_rows
report = dict(snapshot=snapshot(q, "prism"), contents=ledger_contents(q, "prism"),
              alerts=sorted(tuple(r) for r in alerts),
              events=len(ids), event_ids=set(ids),
              stored_offsets={int(p): int(o) for p, o in stored.result_rows},
              dead_letters={(int(p), int(o)): (c, r, h) for p, o, c, r, h in dead.result_rows})
with open(out, "wb") as f:
    pickle.dump(report, f)
"""


def ledger_report(settings: Settings, tmp: Path) -> LedgerReport:
    """Read ``settings``' ledger in a child process (no worker may hold it)."""
    out = tmp / f"report-{time.monotonic_ns()}.pickle"
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _REPORT,
            settings.clickhouse_dsn.get_secret_value(),
            settings.topics.input,
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"reading {settings.clickhouse_dsn} failed: {proc.stderr[-3000:]}")
    with open(out, "rb") as f:
        return LedgerReport(**pickle.load(f))


def committed_offsets(settings: Settings, group: str | None = None) -> dict[int, int]:
    """The group's committed offset per input partition (absent: nothing committed)."""

    async def read() -> dict[int, int]:
        from aiokafka import TopicPartition
        from aiokafka.admin import AIOKafkaAdminClient

        admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap_servers)
        await admin.start()
        try:
            tps = [TopicPartition(settings.topics.input, p) for p in range(settings.partitions)]
            got = await admin.list_consumer_group_offsets(
                group or settings.consumer_group, partitions=tps
            )
            return {tp.partition: m.offset for tp, m in got.items() if m and m.offset >= 0}
        finally:
            await admin.close()

    return asyncio.run(read())


def group_members(settings: Settings) -> tuple[str, int]:
    """(state, member count) of the settings' consumer group."""

    async def read() -> tuple[str, int]:
        from aiokafka.admin import AIOKafkaAdminClient

        admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap_servers)
        await admin.start()
        try:
            (resp,) = await admin.describe_consumer_groups([settings.consumer_group])
            group = resp.groups[0]
            return str(group[2]), len(group[5])
        finally:
            await admin.close()

    return asyncio.run(read())


def read_topic(settings: Settings, topic: str, timeout: float = 60.0) -> list[Any]:
    """Every record of ``topic`` (one of the settings' topics), from offset 0 to its end."""

    async def read() -> list[Any]:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        consumer = AIOKafkaConsumer(
            bootstrap_servers=settings.kafka_bootstrap_servers,
            enable_auto_commit=False,
            fetch_max_bytes=16 * 1_048_576,
            max_partition_fetch_bytes=8 * 1_048_576,
        )
        await consumer.start()
        records: list[Any] = []
        try:
            tps = [TopicPartition(topic, p) for p in range(settings.partitions)]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            ends = await consumer.end_offsets(tps)
            deadline = time.monotonic() + timeout
            while [tp for tp, end in ends.items() if await consumer.position(tp) < end]:
                if time.monotonic() > deadline:
                    raise AssertionError(f"could not read {topic} to its end in {timeout:.0f}s")
                batch = await consumer.getmany(timeout_ms=1000)
                for recs in batch.values():
                    records.extend(recs)
            return records
        finally:
            await consumer.stop()

    return asyncio.run(read())
