"""A local multi-broker KRaft cluster on 127.0.0.1 (3 nodes by default) from ``LocalKafka``'s jars.

Each node is a ``LocalKafka`` (subclassed for its configuration only) in its own folder
``node-<id>`` under the cluster's state directory, with its own broker and controller ports,
data, log and pid file. Every node is broker and controller at once (KRaft combined mode:
three JVMs on a laptop rather than six); the controllers form one static quorum, so the
cluster survives the loss of any one node. Topics default to replication factor
``min(3, nodes)`` and ``min.insync.replicas=2`` (internal topics too), so an ``acks=all``
write is on two nodes before it is acknowledged. Failure detection is tuned for tests: a
killed node is fenced after ``broker.session.timeout.ms=3000`` and a new controller is
elected within about a second.

Ports and the cluster id live in ``cluster.json``, so ``down``, ``status`` and a restarted
node find them again.

Example::

    cluster = LocalKafkaCluster(Path(".data/kafka-cluster"), brokers=3, port=9092)
    cluster.up()                      # brokers on 9092, 9093, 9094
    cluster.bootstrap                 # "127.0.0.1:9092,127.0.0.1:9093,127.0.0.1:9094"
    cluster.kill(cluster.leader_of("prism.agent-events", 0))
    cluster.start(...)                # the same node back, on its data
    cluster.down()
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._kafka import DevstackError, LocalKafka, free_port
from ._quorum import partition_state, quorum_leader, registered_brokers, topic_states

__all__ = ["KafkaNode", "LocalKafkaCluster"]

_CLUSTER_FILE = "cluster.json"


@dataclass
class KafkaNode(LocalKafka):
    """One broker+controller node of a ``LocalKafkaCluster`` (only its configuration differs)."""

    node_id: int = 1
    voters: str = ""  # controller.quorum.voters: "1@127.0.0.1:p1,2@127.0.0.1:p2,..."
    replication: int = 3
    min_isr: int = 2
    # C1 only: a node starts in about half the time on a busy laptop or CI runner, which
    # is what fault tests restarting nodes wait for; peak throughput does not matter here.
    # On the command line, never through a wrapper script: the nodes start from threads
    # side by side, and a script one thread has just written can be open for writing in
    # another thread's forked child, which makes its exec fail with ETXTBSY.
    jvm_options: tuple[str, ...] = ("-XX:TieredStopAtLevel=1",)

    def _write_config(self, data: Path, cport: int) -> Path:
        props = super()._write_config(data, cport)  # also writes the log4j2 configuration
        settings = {
            "node.id": str(self.node_id),
            "controller.quorum.voters": self.voters,
            "default.replication.factor": str(self.replication),
            "min.insync.replicas": str(self.min_isr),
            "offsets.topic.replication.factor": str(self.replication),
            "transaction.state.log.replication.factor": str(self.replication),
            "transaction.state.log.min.isr": str(self.min_isr),
            "share.coordinator.state.topic.replication.factor": str(self.replication),
            "share.coordinator.state.topic.min.isr": str(self.min_isr),
            "unclean.leader.election.enable": "false",
            "broker.heartbeat.interval.ms": "500",
            "broker.session.timeout.ms": "3000",
            "controller.quorum.election.timeout.ms": "1000",
            "controller.quorum.fetch.timeout.ms": "2000",
        }
        lines = [
            line
            for line in props.read_text().splitlines()
            if line.split("=", 1)[0] not in settings
            and not line.startswith("controller.quorum.bootstrap.servers=")
        ]
        lines += [f"{k}={v}" for k, v in settings.items()]
        props.write_text("\n".join(lines) + "\n")
        return props


@dataclass
class LocalKafkaCluster:
    """``brokers`` combined nodes under ``state_dir``; brokers listen on ``port``, ``port+1``, ...

    ``port=None`` means the ports saved in ``cluster.json`` or, for a new cluster,
    ``PRISM_KAFKA_PORT`` and the ports after it (9092, 9093, ... by default); controllers
    take free ports. Ports chosen once are kept in ``cluster.json`` and reused.
    """

    state_dir: Path
    brokers: int = 3
    port: int | None = None
    heap: str = "384m"
    partitions: int = 4
    # None: each node's default (C1 only, fast starts); () for full tiered compilation,
    # which a run of many minutes repays: in a 3-minute soak at 5,000 events/s the three
    # brokers took 0.85 cores after a minute of warm-up, 1.0 with C1 only
    jvm_options: tuple[str, ...] | None = None
    nodes: list[KafkaNode] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        if self.brokers < 1:
            raise DevstackError(f"a cluster needs at least 1 broker, got {self.brokers}")
        saved = self._load()
        if saved is not None and len(saved["nodes"]) != self.brokers:
            raise DevstackError(
                f"{self.state_dir} holds a {len(saved['nodes'])}-broker cluster, not "
                f"{self.brokers}; use --brokers {len(saved['nodes'])}, or another --state-dir"
            )
        if saved is None:
            first = self.port or int(os.environ.get("PRISM_KAFKA_PORT", "9092"))
            ports = [first + i for i in range(self.brokers)]
            cports = [free_port() for _ in range(self.brokers)]
            saved = {
                "cluster_id": base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("="),
                "nodes": [
                    {"id": i + 1, "port": p, "controller_port": c}
                    for i, (p, c) in enumerate(zip(ports, cports, strict=True))
                ],
            }
        elif self.port is not None and saved["nodes"][0]["port"] != self.port:
            raise DevstackError(
                f"the cluster in {self.state_dir} listens on port {saved['nodes'][0]['port']}, "
                f"not {self.port}; use --port {saved['nodes'][0]['port']} or another --state-dir"
            )
        self.cluster_id: str = saved["cluster_id"]
        self._saved = saved
        voters = ",".join(f"{n['id']}@127.0.0.1:{n['controller_port']}" for n in saved["nodes"])
        replication = min(3, self.brokers)
        jvm: dict[str, Any] = {} if self.jvm_options is None else {"jvm_options": self.jvm_options}
        self.nodes = [
            KafkaNode(
                state_dir=self.state_dir / f"node-{n['id']}",
                port=n["port"],
                controller_port=n["controller_port"],
                heap=self.heap,
                partitions=self.partitions,
                node_id=n["id"],
                voters=voters,
                replication=replication,
                min_isr=min(2, replication),
                **jvm,
            )
            for n in saved["nodes"]
        ]

    @classmethod
    def found_in(cls, state_dir: Path) -> LocalKafkaCluster | None:
        """The cluster whose ``cluster.json`` is in ``state_dir``, if there is one."""
        try:
            saved = json.loads((state_dir / _CLUSTER_FILE).read_text())
        except (OSError, ValueError):
            return None
        return cls(state_dir, brokers=len(saved["nodes"]))

    def _load(self) -> dict[str, Any] | None:
        try:
            saved: dict[str, Any] = json.loads((self.state_dir / _CLUSTER_FILE).read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise DevstackError(
                f"{self.state_dir / _CLUSTER_FILE} is unreadable ({exc}); remove the folder "
                "to start a fresh cluster"
            ) from exc
        return saved

    @property
    def bootstrap(self) -> str:
        """Every broker's ``host:port``, comma-separated."""
        return ",".join(n.bootstrap for n in self.nodes)

    def node(self, node_id: int) -> KafkaNode:
        """The node with this id (1-based)."""
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        raise DevstackError(f"no node {node_id} in this {self.brokers}-node cluster")

    # -- lifecycle ----------------------------------------------------------------------
    def up(self, timeout: float = 180.0) -> None:
        """Format every node (first time), start them together, wait until all brokers serve."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        (self.state_dir / _CLUSTER_FILE).write_text(json.dumps(self._saved, indent=1) + "\n")
        # A node answers only once a quorum of controllers runs: start them side by side.
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            for f in [pool.submit(self._format, n) for n in self.nodes]:
                f.result()
            for f in [pool.submit(n.up, timeout) for n in self.nodes]:
                f.result()
        self.wait_ready(timeout)

    def _format(self, node: KafkaNode) -> None:
        data = node.state_dir / "data"
        if (data / "meta.properties").exists():
            return
        java = shutil.which(node.java)
        if java is None:
            raise DevstackError("Java is not on PATH; Kafka needs Java 17 or newer.")
        lib = node.ensure_jars()
        node.state_dir.mkdir(parents=True, exist_ok=True)
        props = node._write_config(data, node.controller_port or 0)
        fmt = node.format_storage(java, lib, props, self.cluster_id)
        if fmt.returncode != 0:
            raise DevstackError(
                f"formatting the storage of node {node.node_id} failed:\n{fmt.stderr[-2000:]}"
            )

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Wait until every broker is registered with the controller and serves metadata."""
        deadline = time.monotonic() + timeout
        seen: set[int] = set()
        while time.monotonic() < deadline:
            seen = registered_brokers(self.bootstrap)
            if len(seen) == len(self.nodes):
                return
            time.sleep(0.5)
        raise DevstackError(
            f"only brokers {sorted(seen)} of {len(self.nodes)} registered within {timeout:.0f}s; "
            f"see the logs under {self.state_dir}/node-*/broker.log"
        )

    def down(self) -> None:
        """Stop every node (SIGTERM, then SIGKILL); their data stays for the next ``up``."""
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            list(pool.map(lambda n: n.down(), self.nodes))

    def kill(self, node_id: int) -> None:
        """SIGKILL one node (fault injection); ``start`` brings it back on its data."""
        self.node(node_id).kill()

    def stop(self, node_id: int) -> None:
        """Stop one node cleanly (a rolling restart's first half)."""
        self.node(node_id).down()

    def start(self, node_id: int, timeout: float = 120.0) -> None:
        """Start one node again on its data and wait until it serves metadata."""
        self.node(node_id).up(timeout)

    def status(self) -> list[str]:
        """One line per node: id, broker port and its ``LocalKafka.status()``."""
        return [
            f"node {n.node_id}: 127.0.0.1:{n.port} (controller {n.controller_port}) {n.status()}"
            for n in self.nodes
        ]

    # -- who leads ----------------------------------------------------------------------
    def controller(self) -> int:
        """The node id of the active controller (the quorum leader), as the live nodes say."""
        live = [n for n in self.nodes if n.pid() is not None]
        leader = quorum_leader([n.state_dir / "data" for n in live])
        if leader is None:
            raise DevstackError(f"no live node of {self.state_dir} knows a quorum leader")
        return leader

    def partitions_of(self, topic: str) -> dict[int, tuple[int, list[int]]]:
        """``partition -> (leader node id, in-sync replica ids)`` of ``topic``."""
        return partition_state(self.bootstrap, topic)

    def leader_of(self, topic: str, partition: int = 0) -> int:
        """The node id leading ``topic``'s ``partition``."""
        return self.partitions_of(topic)[partition][0]

    def wait_in_sync(self, topics: list[str] | None = None, timeout: float = 120.0) -> float:
        """Wait until every partition (of ``topics``, default all) has a leader and full ISR.

        Returns the seconds waited. The step a rolling restart takes between two nodes:
        stopping the next one earlier would leave partitions below ``min.insync.replicas``.
        """
        started = time.monotonic()
        deadline = started + timeout
        want = min(3, self.brokers)
        short: Any = None
        while time.monotonic() < deadline:
            try:
                states = topic_states(self.bootstrap, list(topics or []))
                short = {
                    (topic, p): (leader, isr)
                    for topic, parts in states.items()
                    for p, (leader, isr) in parts.items()
                    if leader < 0 or len(isr) < want
                }
                if topics and set(topics) - set(states):
                    short["missing"] = sorted(set(topics) - set(states))
            except Exception as exc:  # a node is still joining
                short = repr(exc)
            if not short:
                return time.monotonic() - started
            time.sleep(0.5)
        raise DevstackError(f"replicas not in sync within {timeout:.0f}s: {short}")
