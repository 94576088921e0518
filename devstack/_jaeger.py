"""A local Jaeger v2 (OTLP in, in-memory storage, the ``/api/v3`` query API) on 127.0.0.1.

The binary is built once with the machine's Go from Jaeger's own module at
``JAEGER_VERSION`` (``go get -tool``, then ``go build``: about 5-7 minutes and 2 GB of
memory cold, nothing when cached) into ``.cache/jaeger/v<version>/jaeger`` (ignored), as the
Kafka jars are fetched once. ``up`` writes a YAML config on free ports (OTLP/HTTP, the
query API, the health check, all on 127.0.0.1; no self-tracing), starts it detached and
waits until its query API answers; ``down`` stops it. ``state.json`` in the state directory
keeps its ports for ``down``, ``status`` and the tests.

Example::

    jaeger = LocalJaeger(Path(".data/jaeger"))
    jaeger.up()             # builds on first use
    jaeger.otlp_endpoint    # "http://127.0.0.1:43187" -> prism-pipeline traces --endpoint
    jaeger.query_url        # "http://127.0.0.1:43190"  (UI and /api/v3/traces)
    jaeger.down()
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from ._kafka import DevstackError, free_port
from ._service import LocalService, http_ok, repo_cache

__all__ = ["JAEGER_MODULE", "JAEGER_VERSION", "LocalJaeger", "build_jaeger", "jaeger_binary"]

JAEGER_VERSION = "1.75.0"  # the package lists' approved release; newer ones are not
JAEGER_MODULE = "github.com/jaegertracing/jaeger"
BUILD_TIMEOUT = 1500.0  # seconds for a cold `go get` + `go build`


def jaeger_binary(home: Path | None = None) -> Path:
    """Where the built binary of ``JAEGER_VERSION`` is kept (it may not be built yet)."""
    return (home or repo_cache() / "jaeger") / f"v{JAEGER_VERSION}" / "jaeger"


def build_jaeger(home: Path | None = None, timeout: float = BUILD_TIMEOUT) -> Path:
    """The Jaeger binary of ``JAEGER_VERSION``, built with Go into ``home`` unless it is there."""
    binary = jaeger_binary(home)
    folder = binary.parent
    if binary.is_file():
        return binary
    go = shutil.which("go")
    if go is None:
        raise DevstackError(
            f"Go is not on PATH; it builds Jaeger {JAEGER_VERSION} once into {binary} "
            "(install Go 1.24 or newer)"
        )
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "go.mod").write_text("module prism.local/jaeger-build\n\ngo 1.24\n")
    log = folder / "build.log"
    started = time.monotonic()
    steps = (
        [go, "get", "-tool", f"{JAEGER_MODULE}/cmd/jaeger@v{JAEGER_VERSION}"],
        [go, "build", "-o", "jaeger.partial", f"{JAEGER_MODULE}/cmd/jaeger"],
    )
    with open(log, "wb") as out:
        for argv in steps:
            left = timeout - (time.monotonic() - started)
            try:
                done = subprocess.run(
                    argv, cwd=folder, stdout=out, stderr=subprocess.STDOUT, timeout=max(left, 1)
                )
            except subprocess.TimeoutExpired:
                raise DevstackError(
                    f"building Jaeger {JAEGER_VERSION} took longer than {timeout:.0f}s "
                    f"({' '.join(argv[:2])}); see {log}"
                ) from None
            if done.returncode != 0:
                tail = log.read_text(errors="replace")[-2000:]
                raise DevstackError(
                    f"`{' '.join(argv[1:3])}` failed (exit {done.returncode}) building Jaeger "
                    f"{JAEGER_VERSION}; see {log}:\n{tail}"
                )
    os.replace(folder / "jaeger.partial", binary)
    return binary


@dataclass
class LocalJaeger(LocalService):
    """One Jaeger v2 process whose config, log and pid live under ``state_dir``."""

    state_dir: Path
    home: Path | None = None
    max_traces: int = 100_000
    ports: dict[str, int] = field(default_factory=dict)
    name: str = "jaeger"

    @property
    def otlp_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port('otlp_http')}"

    @property
    def query_url(self) -> str:
        return f"http://127.0.0.1:{self.port('query_http')}"

    def _ready(self) -> bool:
        return http_ok(f"{self.query_url}/api/v3/services")

    def _command(self) -> tuple[list[str], dict[str, str]]:
        binary = build_jaeger(self.home)
        self.ports = {k: free_port() for k in ("otlp_http", "query_http", "query_grpc", "health")}
        config = self.state_dir / "config.yaml"
        config.write_text(_CONFIG.format(max_traces=self.max_traces, **self.ports))
        return [str(binary), "--config", f"file:{config.resolve()}"], {}


# OTLP/HTTP in, memory storage, the query API (HTTP and gRPC), a health check; no
# Prometheus endpoint and no self-tracing (jaeger_query.enable_tracing: false).
_CONFIG = """\
service:
  extensions: [jaeger_storage, jaeger_query, healthcheckv2]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    resource:
      service.name: jaeger
    metrics:
      level: none
    logs:
      level: warn

extensions:
  healthcheckv2:
    use_v2: true
    http:
      endpoint: 127.0.0.1:{health}
  jaeger_query:
    enable_tracing: false
    storage:
      traces: memstore
    http:
      endpoint: 127.0.0.1:{query_http}
    grpc:
      endpoint: 127.0.0.1:{query_grpc}
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: {max_traces}

receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:{otlp_http}

processors:
  batch:

exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
"""
