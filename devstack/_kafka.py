"""A real local Apache Kafka broker (KRaft, combined broker+controller) on 127.0.0.1.

The broker's jars come from Maven Central through ``devstack/kafka/pom.xml`` into
``devstack/kafka/lib`` (ignored, fetched once). Each broker instance lives in a state
directory holding its ``server.properties``, log4j2 config, data, ``broker.log`` and
``broker.pid``; ``up`` formats storage, starts the JVM detached and waits until the
broker answers a metadata request; ``down`` stops it (SIGTERM, then SIGKILL).

Example::

    broker = LocalKafka(state_dir=Path(".data/kafka"), port=9092)
    broker.up()        # downloads jars on first use, then reuses them
    broker.bootstrap   # "127.0.0.1:9092"
    broker.down()

Errors are ``DevstackError`` with what went wrong and what to do. ``up`` refuses a state
directory whose broker is alive on another port (two JVMs on one KRaft metadata log corrupt
it) and a port something else holds, each in one line.
"""

from __future__ import annotations

import base64
import fcntl
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["PORT_VARIABLE", "DevstackError", "LocalKafka", "free_port", "kafka_home"]

KAFKA_VERSION = "4.4.0"
# The one variable that picks the local broker's port (make demo, make kafka-up, devstack).
PORT_VARIABLE = "PRISM_KAFKA_PORT"


class DevstackError(RuntimeError):
    """The local broker could not be prepared, started or stopped."""


def kafka_home() -> Path:
    """Folder holding the pom and the fetched ``lib/`` of broker jars."""
    return Path(os.environ.get("PRISM_KAFKA_HOME", Path(__file__).resolve().parent / "kafka"))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_in_use(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _java_major(java: str) -> int:
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    text = out.stderr + out.stdout
    m = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if not m:
        raise DevstackError(f"could not read the Java version from {java!r}: {text.strip()!r}")
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major


def _metadata_request_ok(port: int, timeout: float = 2.0) -> bool:
    """Send a Kafka Metadata v0 request and check that a well-formed reply with brokers arrives."""
    client_id = b"prism-devstack"
    # Metadata v0: api_key=3, version=0, correlation_id, client_id, topics array (empty)
    body = struct.pack(">hhih", 3, 0, 7, len(client_id)) + client_id + struct.pack(">i", 0)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(struct.pack(">i", len(body)) + body)
            header = s.recv(4)
            if len(header) < 4:
                return False
            (size,) = struct.unpack(">i", header)
            payload = b""
            while len(payload) < size:
                chunk = s.recv(size - len(payload))
                if not chunk:
                    return False
                payload += chunk
        correlation_id, broker_count = struct.unpack(">ii", payload[:8])
        return correlation_id == 7 and broker_count >= 1
    except OSError:
        return False


@dataclass
class LocalKafka:
    """One single-node KRaft broker whose files live under ``state_dir``."""

    state_dir: Path
    port: int = 9092
    controller_port: int | None = None
    heap: str = "512m"
    partitions: int = 4
    java: str = field(default_factory=lambda: shutil.which("java") or "java")
    # Options put right after ``java`` on every command line (the format and the broker).
    jvm_options: tuple[str, ...] = ()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.state_dir / "broker.log"

    @property
    def _pid_file(self) -> Path:
        return self.state_dir / "broker.pid"

    # -- jars ---------------------------------------------------------------------------
    def ensure_jars(self) -> Path:
        """Fetch the broker jars with Maven unless the cache already has them."""
        home = kafka_home()
        lib = home / "lib"
        if (lib / f"kafka_2.13-{KAFKA_VERSION}.jar").exists():
            return lib
        mvn = shutil.which("mvn")
        if mvn is None:
            raise DevstackError(
                "Maven ('mvn') is not on PATH; it is needed once to fetch the Kafka "
                f"{KAFKA_VERSION} jars into {lib}. Install it (apt-get install maven)."
            )
        proc = subprocess.run(
            [mvn, "-q", "-B", "-f", str(home / "pom.xml"), "package"],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0 or not (lib / f"kafka_2.13-{KAFKA_VERSION}.jar").exists():
            raise DevstackError(
                f"Maven could not fetch the Kafka jars (exit {proc.returncode}):\n"
                f"{(proc.stdout + proc.stderr)[-2000:]}"
            )
        return lib

    # -- lifecycle ----------------------------------------------------------------------
    def pid(self) -> int | None:
        """The pid of this state directory's broker while it runs, else None."""
        try:
            pid = int(self._pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        if _is_zombie(pid) or not _is_broker_of(pid, self.state_dir):
            return None  # a stale pid file, or the pid now belongs to another process
        return pid

    def configured_port(self) -> int | None:
        """The listener port written in this state directory's ``server.properties``."""
        try:
            text = (self.state_dir / "server.properties").read_text()
        except OSError:
            return None
        m = re.search(r"^listeners=PLAINTEXT://[^:]+:(\d+)", text, re.MULTILINE)
        return int(m.group(1)) if m else None

    def data_locked(self) -> bool:
        """Whether a running broker holds the lock of this state directory's data (any pid)."""
        lock = self.state_dir / "data" / ".lock"
        if not lock.exists():
            return False
        try:
            with open(lock, "rb+") as f:
                try:
                    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    return True
                fcntl.lockf(f, fcntl.LOCK_UN)
                return False
        except OSError:
            return False

    def status(self) -> str:
        """``stopped``, ``running on 127.0.0.1:PORT (pid N)`` or ``starting (pid N)``."""
        pid = self.pid()
        if pid is None:
            return "stopped"
        port = self.configured_port() or self.port
        if _metadata_request_ok(port):
            return f"running on 127.0.0.1:{port} (pid {pid})"
        return f"starting (pid {pid})"

    def java_command(self, java: str, lib: Path) -> list[str]:
        """``java`` with this broker's JVM options, heap, jars and logging: how the format's
        and the broker's command lines begin."""
        return [
            java,
            *self.jvm_options,
            f"-Xmx{self.heap}",
            f"-Xms{self.heap}",
            "-cp",
            f"{lib}/*",
            f"-Dlog4j2.configurationFile={self.state_dir / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={self.state_dir}",
        ]

    def format_storage(
        self, java: str, lib: Path, props: Path, cluster_id: str, *flags: str
    ) -> subprocess.CompletedProcess[str]:
        """Format this broker's KRaft storage (``StorageTool format``) for ``cluster_id``."""
        return subprocess.run(
            [
                *self.java_command(java, lib),
                "kafka.tools.StorageTool",
                "format",
                *flags,
                f"--cluster-id={cluster_id}",
                f"--config={props}",
            ],
            capture_output=True,
            text=True,
            check=False,
        )

    def up(self, timeout: float = 90.0) -> None:
        """Format storage (first time), start the broker and wait until it serves metadata.

        A broker of this state directory that already runs on ``port`` is reused; one that
        runs on another port is refused (a second JVM would corrupt its metadata log).
        """
        self._refuse_running_broker()
        if self.pid() is not None and _metadata_request_ok(self.port):
            return
        java = shutil.which(self.java) or self.java
        if not shutil.which(java):
            raise DevstackError("Java is not on PATH; Kafka needs Java 17 or newer.")
        major = _java_major(java)
        if major < 17:
            raise DevstackError(f"Kafka {KAFKA_VERSION} needs Java >= 17, found Java {major}.")
        cport = self.controller_port or free_port()
        for p, what in ((self.port, "port"), (cport, "controller port")):
            if _port_in_use(p):
                raise DevstackError(
                    f"{what} {p} on 127.0.0.1 is already in use by another program; free it "
                    f"or choose another port ({PORT_VARIABLE}=19092 make demo, or --port 19092)"
                )
        lib = self.ensure_jars()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        data = self.state_dir / "data"
        props = self._write_config(data, cport)
        if not (data / "meta.properties").exists():
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
            fmt = self.format_storage(java, lib, props, cluster_id, "--standalone")
            if fmt.returncode != 0:
                raise DevstackError(f"formatting KRaft storage failed:\n{fmt.stderr[-2000:]}")
        with open(self.log_file, "ab") as log:
            proc = subprocess.Popen(
                [*self.java_command(java, lib), "-XX:+UseG1GC", "kafka.Kafka", str(props)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._pid_file.write_text(str(proc.pid))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise DevstackError(
                    f"the broker exited with code {proc.returncode}; see {self.log_file}:\n"
                    + self._log_tail()
                )
            if _metadata_request_ok(self.port):
                return
            time.sleep(0.25)
        self.down()
        raise DevstackError(
            f"the broker did not answer metadata requests on {self.bootstrap} within "
            f"{timeout:.0f}s; see {self.log_file}:\n{self._log_tail()}"
        )

    def _refuse_running_broker(self) -> None:
        pid = self.pid()
        running_port = self.configured_port()
        if pid is not None:
            if running_port == self.port:
                return  # the same broker: up() reuses it once it answers
            raise DevstackError(
                f"a broker from {self.state_dir} already runs (pid {pid}, port {running_port}); "
                f"a second one on port {self.port} would corrupt its metadata log. Use port "
                f"{running_port}, stop it first (prism-pipeline devstack kafka down "
                f"--state-dir {self.state_dir}), or choose another --state-dir"
            )
        if self.data_locked():
            raise DevstackError(
                f"the data of {self.state_dir} is locked by a running broker that has no pid "
                f"file (port {running_port}); stop that process before starting another "
                "broker on this state directory, or choose another --state-dir"
            )

    def down(self, timeout: float = 30.0) -> None:
        """Stop the broker: SIGTERM for a clean shutdown, SIGKILL if it does not exit."""
        pid = self.pid()
        if pid is None:
            self._pid_file.unlink(missing_ok=True)
            return
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.pid() is None or _is_zombie(pid):
                break
            time.sleep(0.2)
        else:
            os.kill(pid, signal.SIGKILL)
        self._pid_file.unlink(missing_ok=True)

    def kill(self) -> None:
        """SIGKILL the broker (fault injection)."""
        pid = self.pid()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            while self.pid() is not None and not _is_zombie(pid):
                time.sleep(0.05)

    # -- files --------------------------------------------------------------------------
    def _write_config(self, data: Path, cport: int) -> Path:
        props = self.state_dir / "server.properties"
        props.write_text(
            "\n".join(
                [
                    "process.roles=broker,controller",
                    "node.id=1",
                    f"controller.quorum.bootstrap.servers=127.0.0.1:{cport}",
                    f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{cport}",
                    f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
                    "controller.listener.names=CONTROLLER",
                    "inter.broker.listener.name=PLAINTEXT",
                    "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                    f"log.dirs={data}",
                    f"num.partitions={self.partitions}",
                    "offsets.topic.replication.factor=1",
                    "offsets.topic.num.partitions=4",
                    "transaction.state.log.replication.factor=1",
                    "transaction.state.log.min.isr=1",
                    "share.coordinator.state.topic.replication.factor=1",
                    "share.coordinator.state.topic.min.isr=1",
                    "group.initial.rebalance.delay.ms=0",
                    "auto.create.topics.enable=true",
                    "message.max.bytes=4194304",
                    "log.flush.interval.messages=9223372036854775807",
                    "",
                ]
            )
        )
        (self.state_dir / "log4j2.properties").write_text(
            "\n".join(
                [
                    "status = warn",
                    "appender.out.type = Console",
                    "appender.out.name = out",
                    "appender.out.layout.type = PatternLayout",
                    "appender.out.layout.pattern = [%d] %p %m (%c)%n",
                    "rootLogger.level = WARN",
                    "rootLogger.appenderRef.out.ref = out",
                    "logger.kafka.name = kafka.server.KafkaRaftServer",
                    "logger.kafka.level = INFO",
                    "",
                ]
            )
        )
        return props

    def _log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"


def _is_broker_of(pid: int, state_dir: Path) -> bool:
    """Whether ``pid`` is a Kafka JVM started with this state directory's config."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return True  # no /proc to ask: trust the pid file
    if b"kafka.Kafka" not in argv:
        return False
    try:
        cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        cwd = Path.cwd()
    mine = (state_dir / "server.properties").resolve()
    return any(
        (cwd / os.fsdecode(arg)).resolve() == mine
        for arg in argv
        if arg.endswith(b"server.properties")
    )


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True
