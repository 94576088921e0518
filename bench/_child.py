"""Run a benchmark module's measuring part in a child process (chDB: one engine per process)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

__all__ = ["run_child"]


def run_child(module: str, *args: str) -> list[dict[str, Any]]:
    """``python -m <module> --child <args>``; the rows it prints as JSON on its last line."""
    cmd = [sys.executable, "-m", module, "--child", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{module} child failed ({done.returncode}):\n{done.stderr[-3000:]}")
    rows: list[dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])
    return rows
