"""Failover through a local 3-broker cluster while a fleet flows: the ledger stays exact.

One cluster per module, started and stopped through the CLI (``devstack kafka up --brokers
3``). While one idempotent ``acks=all`` producer sends a simulated chaotic fleet at a
steady pace and a worker subprocess consumes it, the broker leading input partition 0 is
SIGKILLed and brought back, then the active controller, then all three are restarted one
after the other (a rolling restart); each comes back on its data. The publisher must not
fail, the worker must not crash, and its ledger must equal the simulator's manifest. The
timings seen are printed. One test carries all three phases: each phase alone would pay
again for a worker, a fleet and a ledger check, and the whole run must stay short in CI.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from prism.devstack import LocalKafkaCluster
from prism.devstack.workerproc import wait_members
from prism.pipeline.settings import Settings
from prism.pipeline.topics import ensure_topics
from prism.runtime.simulator import Fleet, FleetConfig, simulate
from tests.fixtures.flow import Flow
from tests.integration.test_faults_harness import CHAOS, FaultLab, ledger_report

pytestmark = [pytest.mark.integration]


def _consecutive_free_ports(n: int) -> int:
    """A port p such that p .. p+n-1 are all free on 127.0.0.1 right now."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = int(s.getsockname()[1])
        if base + n > 65535:
            continue
        free = True
        for p in range(base + 1, base + n):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    free = False
                    break
        if free:
            return base
    raise RuntimeError(f"found no {n} consecutive free ports")


def _cli(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "prism.pipeline.cli", "devstack", "kafka", *args],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    if out.returncode != 0:
        pytest.fail(f"devstack kafka {' '.join(args)} failed:\n{out.stderr[-3000:]}", False)
    return out.stdout


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafkaCluster]:
    """A 3-broker cluster started by ``prism-pipeline devstack kafka up --brokers 3``."""
    state = tmp_path_factory.mktemp("cluster")
    port = _consecutive_free_ports(3)
    where = ("--brokers", "3", "--port", str(port), "--state-dir", str(state))
    started = time.monotonic()
    printed = _cli("up", *where)
    print(f"cluster up in {time.monotonic() - started:.1f}s: {printed.strip()}")
    found = LocalKafkaCluster.found_in(state)
    assert found is not None and found.bootstrap in printed
    try:
        yield found
    finally:
        _cli("down", "--state-dir", str(state))
        assert all(line.endswith("stopped") for line in _cli("status", *where).splitlines())


@pytest.fixture
def clab(cluster: LocalKafkaCluster, topic_prefix: str, tmp_path: Path) -> Iterator[FaultLab]:
    cluster.wait_in_sync(timeout=120)  # every node back and caught up before each test
    lab = FaultLab(cluster.bootstrap, topic_prefix, tmp_path)
    try:
        yield lab
    finally:
        lab.close()


def _wait(what: str, check: Callable[[], Any], timeout: float = 60.0) -> tuple[Any, float]:
    """Poll ``check`` until it returns something truthy; (that value, seconds waited)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            got = check()
        except Exception:  # metadata is moving
            got = None
        if got:
            return got, time.monotonic() - started
        time.sleep(0.2)
    raise AssertionError(f"{what} did not happen within {timeout:.0f}s")


def _start(clab: FaultLab, cluster: LocalKafkaCluster, seed: int) -> tuple[Fleet, Settings, Any]:
    fleet = simulate(FleetConfig(runs=300, seed=seed, **CHAOS))
    s = clab.settings("w", replication_factor=3, store="rocksdb")
    asyncio.run(ensure_topics(s))
    cluster.wait_in_sync([s.topics.input], timeout=60)
    worker = clab.worker(s, "w")
    # Faults start only once the worker consumes: it must ride them out, not start in them.
    wait_members(s.kafka_bootstrap_servers, s.consumer_group, 1, timeout=180)
    return fleet, s, worker


def _finish(clab: FaultLab, fleet: Fleet, s: Settings, worker: Any, flow: Flow) -> str:
    assert flow.flowing, "the fleet was sent before the faults ended; lower Flow's pace"
    assert flow.join() == len(fleet.records)
    drained = time.monotonic()
    clab.drain(worker, s, timeout=180, settle=3.0)
    assert worker.running, "the worker did not survive the failover"
    assert worker.stop() == 0
    problems = ledger_report(s, clab.tmp).problems(fleet.manifest)
    assert problems == [], "\n".join(problems)
    return (
        f"{flow.sent:,} records published in {flow.seconds:.1f}s by one producer without an "
        f"error; worker drained {time.monotonic() - drained:.1f}s after the last was acked"
    )


@pytest.mark.timeout(420)
def test_topics_are_replicated_three_times_with_two_in_sync_required(
    cluster: LocalKafkaCluster, topic_prefix: str, tmp_path: Path
) -> None:
    lab = FaultLab(cluster.bootstrap, topic_prefix, tmp_path)
    s = lab.settings("w", replication_factor=3)
    asyncio.run(ensure_topics(s))
    cluster.wait_in_sync([s.topics.input], timeout=60)
    state = cluster.partitions_of(s.topics.input)
    assert len(state) == s.partitions
    assert all(isr == [1, 2, 3] for _, isr in state.values()), state
    assert {leader for leader, _ in state.values()} <= {1, 2, 3}
    assert _min_isr(cluster.bootstrap, s.topics.input) == "2"
    lines = cluster.status()
    assert len(lines) == 3 and all("running" in line for line in lines), lines


def _min_isr(bootstrap: str, topic: str) -> str:
    async def read() -> str:
        from aiokafka.admin import AIOKafkaAdminClient
        from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            (resp,) = await admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, topic, {"min.insync.replicas": None})]
            )
            (resource,) = resp.to_object()["resources"]
            entries = resource["config_entries"]
            (value,) = [
                c["config_value"] for c in entries if c["config_names"] == "min.insync.replicas"
            ]
            return str(value)
        finally:
            await admin.close()

    return asyncio.run(read())


@pytest.mark.timeout(600)
def test_leader_and_controller_kills_then_a_rolling_restart_lose_and_double_nothing(
    cluster: LocalKafkaCluster, clab: FaultLab
) -> None:
    fleet, s, worker = _start(clab, cluster, seed=1401)
    flow = Flow(fleet.records, s.kafka_bootstrap_servers, s.topics.input, pace=15.0)
    time.sleep(4)  # the fleet flows, the worker joins its group
    timeline = []

    # 1. SIGKILL the broker leading input partition 0; two brokers carry on; it comes back.
    leader = cluster.leader_of(s.topics.input, 0)
    cluster.kill(leader)
    new_leader, elected = _wait(
        "a new leader for partition 0",
        lambda: (lambda n: n if n not in (leader, -1) else None)(
            cluster.leader_of(s.topics.input, 0)
        ),
    )
    time.sleep(3)
    restart = time.monotonic()
    cluster.start(leader)
    back = time.monotonic() - restart
    in_sync = cluster.wait_in_sync(timeout=120)
    timeline.append(
        f"leader {leader} of partition 0 SIGKILLed: node {new_leader} led after {elected:.1f}s; "
        f"node {leader} restarted in {back:.1f}s, all replicas in sync {in_sync:.1f}s later"
    )

    # 2. SIGKILL the active controller (the quorum leader, a broker too); it comes back.
    controller = cluster.controller()
    cluster.kill(controller)
    successor, moved = _wait(
        "a new active controller",
        lambda: (lambda c: c if c != controller else None)(cluster.controller()),
    )
    time.sleep(3)
    restart = time.monotonic()
    cluster.start(controller)
    back = time.monotonic() - restart
    in_sync = cluster.wait_in_sync(timeout=120)
    timeline.append(
        f"controller {controller} SIGKILLed: node {successor} took over after {moved:.1f}s; "
        f"node {controller} restarted in {back:.1f}s, in sync {in_sync:.1f}s later"
    )

    # 3. A rolling restart: each node stopped (SIGTERM, a controlled shutdown that moves its
    #    leaderships first), started, and caught up before the next one goes.
    for node in (1, 2, 3):
        started = time.monotonic()
        cluster.stop(node)
        stopped = time.monotonic() - started
        cluster.start(node)
        back = time.monotonic() - started - stopped
        in_sync = cluster.wait_in_sync(timeout=120)
        timeline.append(
            f"rolling: node {node} stopped in {stopped:.1f}s, started in {back:.1f}s, "
            f"in sync {in_sync:.1f}s later"
        )
    timeline.append(_finish(clab, fleet, s, worker, flow))
    print("\n".join(timeline))
