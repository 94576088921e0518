"""The Makefile finds a Python >= 3.11 by itself and documents its variables in `make help`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAKE = shutil.which("make") or "/usr/bin/make"


def _make(*args: str, path: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "MAKEFLAGS", "MFLAGS")}
    env["PATH"] = path
    return subprocess.run(
        [MAKE, "-s", "-C", str(ROOT), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_only_python3_on_path_is_enough(tmp_path: Path) -> None:
    (tmp_path / "python3").symlink_to(sys.executable)  # this interpreter is >= 3.11
    out = _make("python", path=str(tmp_path))
    assert (out.returncode, out.stdout.strip()) == (0, "python3"), out.stderr


def test_the_newest_suitable_python_wins_and_old_ones_are_passed_over(tmp_path: Path) -> None:
    old = tmp_path / "python3.13"  # a stand-in that is too old: exits 1 on the version check
    old.write_text("#!/bin/sh\nexit 1\n")
    old.chmod(0o755)
    (tmp_path / "python3.12").symlink_to(sys.executable)
    (tmp_path / "python3").symlink_to(sys.executable)
    out = _make("python", path=str(tmp_path))
    assert out.stdout.strip() == "python3.12", out.stderr


def test_no_suitable_python_says_what_to_do(tmp_path: Path) -> None:
    out = _make("python", path=str(tmp_path))
    assert out.returncode != 0
    assert "no Python >= 3.11 found" in out.stderr and "PYTHON=" in out.stderr


def test_help_names_the_real_variables() -> None:
    out = _make("help", path=os.environ["PATH"])
    assert out.returncode == 0, out.stderr
    assert "PRISM_KAFKA_PORT" in out.stdout and "PYTHON=" in out.stdout
    assert "$(" not in out.stdout


def test_make_test_lints_before_it_starts_the_broker() -> None:
    """CI calls `make test`; a lint failure must stop it before the broker and the suite.

    The unit tests run on every core before the broker starts; the integration tests run
    alone, one at a time, against the broker.
    """
    out = _make("-n", "test", path=os.environ["PATH"])
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()

    def first(text: str) -> int:
        return next(i for i, line in enumerate(lines) if text in line)

    checks = [first("ruff check ."), first("ruff format --check ."), first("/mypy")]
    unit, integration = first("/pytest tests/unit -n auto"), first("/pytest tests/integration")
    assert max(checks) < unit < first("devstack kafka up") < integration
    assert " -n " not in lines[integration]
