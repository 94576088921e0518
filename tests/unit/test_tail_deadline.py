"""``tail --timeout`` bounds everything, reaching a broker that does not answer included."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    "which",
    [["--run", "r-1", "--no-ledger"], ["--follow"], ["--operation", "op-1"]],
    ids=["run", "follow", "operation"],
)
def test_tail_timeout_bounds_reaching_a_dead_broker(which: list[str], tmp_path: Path) -> None:
    """It waited 61 s whatever --timeout said: the broker got its own minute to answer."""
    port = _closed_port()  # nobody listens there
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "prism.pipeline.cli", "tail", *which, "--timeout", "2",
         "--bootstrap", f"127.0.0.1:{port}"],
        capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path,
    )  # fmt: skip
    took = time.monotonic() - started
    assert took < 15, f"took {took:.1f}s; {out.stderr}"
    assert out.returncode == 1, out.stderr
    assert out.stderr.startswith("prism-pipeline tail: error: ") and out.stderr.count("\n") == 1
    assert f"127.0.0.1:{port}" in out.stderr and "--bootstrap" in out.stderr, out.stderr
    assert "PRISM_KAFKA_BOOTSTRAP_SERVERS" not in out.stderr
