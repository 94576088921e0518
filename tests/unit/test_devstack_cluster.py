"""The local cluster's layout without starting it: node configs, ports, saved state, the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from prism.devstack import DevstackError, LocalKafkaCluster
from prism.devstack._kafka import KAFKA_VERSION, LocalKafka, free_port
from prism.devstack._quorum import quorum_leader


def props(path: Path) -> dict[str, str]:
    lines = path.read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def test_three_nodes_get_their_own_ports_folders_and_one_static_quorum(tmp_path: Path) -> None:
    cluster = LocalKafkaCluster(tmp_path, brokers=3, port=29092)
    assert cluster.bootstrap == "127.0.0.1:29092,127.0.0.1:29093,127.0.0.1:29094"
    cports = {n.controller_port for n in cluster.nodes}
    assert len(cports) == 3 and not cports & {29092, 29093, 29094}
    voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in cluster.nodes)
    for node in cluster.nodes:
        assert node.state_dir == tmp_path / f"node-{node.node_id}"
        node.state_dir.mkdir()
        assert node.controller_port is not None
        cfg = props(node._write_config(node.state_dir / "data", node.controller_port))
        assert cfg["node.id"] == str(node.node_id)
        assert cfg["process.roles"] == "broker,controller"
        assert cfg["controller.quorum.voters"] == voters
        assert "controller.quorum.bootstrap.servers" not in cfg
        assert cfg["listeners"] == (
            f"PLAINTEXT://127.0.0.1:{node.port},CONTROLLER://127.0.0.1:{node.controller_port}"
        )
        assert cfg["log.dirs"] == str(node.state_dir / "data")
        for key in (
            "default.replication.factor",
            "offsets.topic.replication.factor",
            "transaction.state.log.replication.factor",
        ):
            assert cfg[key] == "3", key
        assert cfg["min.insync.replicas"] == cfg["transaction.state.log.min.isr"] == "2"
        assert cfg["unclean.leader.election.enable"] == "false"
        assert int(cfg["broker.session.timeout.ms"]) <= 3000


def test_a_single_node_cluster_replicates_once(tmp_path: Path) -> None:
    (node,) = LocalKafkaCluster(tmp_path, brokers=1, port=29100).nodes
    (tmp_path / "node-1").mkdir()
    cfg = props(node._write_config(tmp_path / "node-1" / "data", 29200))
    assert (cfg["default.replication.factor"], cfg["min.insync.replicas"]) == ("1", "1")


def test_the_cluster_id_and_ports_are_saved_and_checked(tmp_path: Path) -> None:
    first = LocalKafkaCluster(tmp_path, brokers=3, port=29300)
    (tmp_path / "cluster.json").write_text(json.dumps(first._saved))
    again = LocalKafkaCluster.found_in(tmp_path)
    assert again is not None
    assert (again.cluster_id, again.bootstrap) == (first.cluster_id, first.bootstrap)
    assert [n.controller_port for n in again.nodes] == [n.controller_port for n in first.nodes]
    with pytest.raises(DevstackError, match="holds a 3-broker cluster, not 5; use --brokers 3"):
        LocalKafkaCluster(tmp_path, brokers=5)
    with pytest.raises(DevstackError, match="listens on port 29300, not 29400"):
        LocalKafkaCluster(tmp_path, brokers=3, port=29400)
    assert LocalKafkaCluster.found_in(tmp_path / "elsewhere") is None
    with pytest.raises(DevstackError, match="no node 4"):
        first.node(4)


def test_the_controller_is_read_from_the_freshest_quorum_state(tmp_path: Path) -> None:
    for name, leader, epoch in (("a", 1, 4), ("b", 2, 7), ("c", -1, 9)):
        meta = tmp_path / name / "__cluster_metadata-0"
        meta.mkdir(parents=True)
        (meta / "quorum-state").write_text(
            json.dumps({"leaderId": leader, "leaderEpoch": epoch, "votedId": -1})
        )
    dirs = [tmp_path / n for n in ("a", "b", "c", "missing")]
    assert quorum_leader(dirs) == 2  # epoch 9 has no leader yet; 7 beats 4
    assert quorum_leader([tmp_path / "missing"]) is None


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "prism.pipeline.cli", "devstack", "kafka", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_the_cli_refuses_a_bad_broker_count_naming_it() -> None:
    out = cli("up", "--brokers", "0")
    assert out.returncode == 2
    assert "--brokers: must be a whole number from 1 to 9, got '0'" in out.stderr


def test_cli_status_of_a_cluster_never_started_lists_every_node(tmp_path: Path) -> None:
    out = cli("status", "--brokers", "3", "--port", "29500", "--state-dir", str(tmp_path))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["node 1", "node 2", "node 3"]
    assert all(ln.endswith("stopped") for ln in lines)
    assert "127.0.0.1:29502" in lines[2]


def test_nodes_put_their_jvm_options_on_javas_command_line_and_write_no_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stand-in java that records each command line, reports Java 21 and fails the rest,
    # so that the format and the start stop right after launching it.
    argv_log = tmp_path / "argv.log"
    fake = tmp_path / "bin" / "java"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {argv_log}\n'
        '[ "$1" = -version ] && { echo \'openjdk version "21.0.1"\' >&2; exit 0; }\n'
        "exit 3\n"
    )
    fake.chmod(0o755)
    home = tmp_path / "kafka"
    (home / "lib").mkdir(parents=True)
    (home / "lib" / f"kafka_2.13-{KAFKA_VERSION}.jar").touch()
    monkeypatch.setenv("PRISM_KAFKA_HOME", str(home))
    cluster = LocalKafkaCluster(tmp_path / "c", brokers=3, port=free_port())
    node = cluster.nodes[0]
    assert node.jvm_options == ("-XX:TieredStopAtLevel=1",)
    node.java = str(fake)
    with pytest.raises(DevstackError, match="formatting the storage of node 1 failed"):
        cluster._format(node)
    with pytest.raises(DevstackError, match="exited with code 3"):
        (node.state_dir / "data").mkdir(parents=True)
        (node.state_dir / "data" / "meta.properties").touch()  # formatted: start the broker
        node.up(timeout=10)
    launched = [ln.split() for ln in argv_log.read_text().splitlines() if ln != "-version"]
    assert [
        argv[-2:] if "kafka.Kafka" in argv else argv[argv.index("format")] for argv in launched
    ] == ["format", ["kafka.Kafka", str(node.state_dir / "server.properties")]]
    assert all(argv[0] == "-XX:TieredStopAtLevel=1" for argv in launched)
    assert not (node.state_dir / "java").exists()
    single = LocalKafka(tmp_path / "single")
    assert single.jvm_options == ()  # the single broker runs with the JVM's own defaults
