"""A local Arize Phoenix (OTLP/HTTP in, its own SQLite storage, a REST API) on 127.0.0.1.

Phoenix is installed once from PyPI at ``PHOENIX_VERSION`` into a virtualenv of its own,
``.cache/phoenix/venv`` (ignored): its dependencies (about 850 MB) are not ours and clash
with the pipeline's pins. ``up`` runs ``phoenix serve`` with ``PHOENIX_HOST=127.0.0.1``,
the HTTP port (UI, REST API and OTLP/HTTP at ``/v1/traces``) and the gRPC port (its OTLP
receiver, which listens on every interface) on free ports, its storage in the state
directory, and waits for ``/healthz``.

Example::

    phoenix = LocalPhoenix(Path(".data/phoenix"))
    phoenix.up()               # installs on first use (about 2 minutes)
    phoenix.otlp_endpoint      # "http://127.0.0.1:41871" -> prism-pipeline traces --endpoint
    phoenix.url                # the UI; /v1/projects/<project>/spans
    phoenix.down()
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ._kafka import DevstackError, free_port
from ._service import LocalService, http_ok, repo_cache

__all__ = ["PHOENIX_VERSION", "LocalPhoenix", "install_phoenix", "phoenix_installed"]

PHOENIX_VERSION = "20.26.1"
INSTALL_TIMEOUT = 900.0


def phoenix_installed(home: Path | None = None) -> bool:
    """Whether ``PHOENIX_VERSION`` is installed in its venv under ``home``."""
    venv = (home or repo_cache() / "phoenix") / "venv"
    return (venv / f".installed-{PHOENIX_VERSION}").exists() and (venv / "bin/phoenix").exists()


def install_phoenix(home: Path | None = None, timeout: float = INSTALL_TIMEOUT) -> Path:
    """The ``phoenix`` command of ``PHOENIX_VERSION`` in its own venv, installed unless there."""
    venv = (home or repo_cache() / "phoenix") / "venv"
    command = venv / "bin" / "phoenix"
    stamp = venv / f".installed-{PHOENIX_VERSION}"
    if phoenix_installed(home):
        return command
    python = shutil.which("python3.11") or sys.executable  # Phoenix supports 3.10-3.13
    log = venv.parent / "install.log"
    venv.parent.mkdir(parents=True, exist_ok=True)
    steps = (
        [python, "-m", "venv", "--clear", str(venv)],
        [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
         f"arize-phoenix=={PHOENIX_VERSION}"],
    )  # fmt: skip
    with open(log, "wb") as out:
        for argv in steps:
            try:
                done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, timeout=timeout)
            except subprocess.TimeoutExpired:
                raise DevstackError(
                    f"installing arize-phoenix {PHOENIX_VERSION} took longer than "
                    f"{timeout:.0f}s; see {log}"
                ) from None
            if done.returncode != 0:
                raise DevstackError(
                    f"installing arize-phoenix {PHOENIX_VERSION} into {venv} failed (exit "
                    f"{done.returncode}); see {log}:\n{log.read_text(errors='replace')[-2000:]}"
                )
    stamp.touch()
    return command


@dataclass
class LocalPhoenix(LocalService):
    """One ``phoenix serve`` whose data, log and pid live under ``state_dir``."""

    state_dir: Path
    home: Path | None = None
    ports: dict[str, int] = field(default_factory=dict)
    name: str = "phoenix"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port('otlp_http')}"

    @property
    def otlp_endpoint(self) -> str:
        return self.url  # OTLP/HTTP at /v1/traces beside the UI

    def _ready(self) -> bool:
        return http_ok(f"{self.url}/healthz")

    def _command(self) -> tuple[list[str], dict[str, str]]:
        command = install_phoenix(self.home)
        if not command.exists():
            raise DevstackError(f"{command} is missing; remove {command.parent.parent} and retry")
        self.ports = {"otlp_http": free_port(), "grpc": free_port()}
        env = {
            "PHOENIX_HOST": "127.0.0.1",
            "PHOENIX_PORT": str(self.ports["otlp_http"]),
            "PHOENIX_GRPC_PORT": str(self.ports["grpc"]),
            "PHOENIX_WORKING_DIR": str(self.state_dir.resolve() / "data"),
            "PHOENIX_TELEMETRY_ENABLED": "false",
            "PHOENIX_ALLOW_EXTERNAL_RESOURCES": "false",
        }
        return [str(command), "serve"], env
