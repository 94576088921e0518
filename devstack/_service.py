"""What the local trace backends (Jaeger, Phoenix) share: a detached process on free ports.

A ``LocalService`` keeps ``<name>.pid``, ``<name>.log`` and ``state.json`` (its ports) in
its state directory; ``up`` reuses a running one, else starts ``_command()`` detached and
waits (bounded) until ``_ready()``; ``down`` stops it (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from ._kafka import DevstackError

__all__ = ["LocalService", "http_ok", "repo_cache"]


def repo_cache() -> Path:
    """The checkout's ignored ``.cache`` folder (beside ``devstack/``)."""
    return Path(__file__).resolve().parent.parent / ".cache"


def http_ok(url: str, timeout: float = 2.0) -> bool:
    """Whether ``url`` answers GET with a 2xx status."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return 200 <= int(response.status) < 300
    except (OSError, urllib.error.URLError, ValueError):
        return False


class LocalService:
    """Base of ``LocalJaeger`` and ``LocalPhoenix`` (dataclasses that set the fields below)."""

    state_dir: Path
    ports: dict[str, int]
    name: str
    started_in: float = 0.0  # seconds the last fresh start took to answer

    # -- what a service defines -------------------------------------------------------------
    def _command(self) -> tuple[list[str], dict[str, str]]:
        """argv and extra environment of a fresh start (choose and keep ``self.ports``)."""
        raise NotImplementedError

    def _ready(self) -> bool:
        raise NotImplementedError

    # -- lifecycle --------------------------------------------------------------------------
    @property
    def log_file(self) -> Path:
        return self.state_dir / f"{self.name}.log"

    @property
    def _pid_file(self) -> Path:
        return self.state_dir / f"{self.name}.pid"

    def port(self, name: str) -> int:
        """One of the running service's ports (read from ``state.json`` when not started here)."""
        if not self.ports:
            try:
                self.ports = json.loads((self.state_dir / "state.json").read_text())["ports"]
            except (OSError, ValueError, KeyError):
                raise DevstackError(
                    f"{self.name} is not running from {self.state_dir} (no state.json); "
                    f"start it: prism-pipeline devstack {self.name} up"
                ) from None
        return int(self.ports[name])

    def pid(self) -> int | None:
        try:
            pid = int(self._pid_file.read_text().strip())
            os.kill(pid, 0)
        except (OSError, ValueError):
            return None
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(")")[-1].split()[0] == "Z":
                    return None
        except OSError:
            pass
        return pid

    def status(self) -> str:
        pid = self.pid()
        if pid is None:
            return "stopped"
        return f"running (pid {pid})" if self._ready() else f"starting (pid {pid})"

    def up(self, timeout: float = 120.0) -> None:
        """Start the service (or reuse the running one) and wait until it answers."""
        if self.pid() is not None:
            self.port("otlp_http")  # load the ports of the running one
            if self._wait(self.pid(), timeout):
                return
            raise DevstackError(
                f"{self.name} (pid {self.pid()}) runs but does not answer; stop it "
                f"(prism-pipeline devstack {self.name} down) and start again; see {self.log_file}"
            )
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.ports = {}
        argv, env = self._command()
        with open(self.log_file, "ab") as log:
            proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **env},
                cwd=self.state_dir,
                start_new_session=True,
            )
        self._pid_file.write_text(str(proc.pid))
        (self.state_dir / "state.json").write_text(json.dumps({"ports": self.ports}))
        started = time.monotonic()
        if not self._wait(proc.pid, timeout, proc):
            code = proc.poll()
            self.down()
            said = (
                f"exited with code {code}"
                if code is not None
                else f"did not answer in {timeout:.0f}s"
            )
            raise DevstackError(f"{self.name} {said}; see {self.log_file}:\n{self._log_tail()}")
        self.started_in = time.monotonic() - started

    def _wait(
        self, pid: int | None, timeout: float, proc: subprocess.Popen[bytes] | None = None
    ) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                return False
            if self._ready():
                return True
            time.sleep(0.25)
        return False

    def down(self, timeout: float = 20.0) -> None:
        """Stop the service: SIGTERM to its process group, SIGKILL if it does not exit."""
        pid = self.pid()
        if pid is not None:
            try:
                os.killpg(pid, signal.SIGTERM)
            except OSError:
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while self.pid() is not None and time.monotonic() < deadline:
                time.sleep(0.2)
            if self.pid() is not None:
                os.killpg(pid, signal.SIGKILL)
        self._pid_file.unlink(missing_ok=True)
        (self.state_dir / "state.json").unlink(missing_ok=True)

    def _log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"
