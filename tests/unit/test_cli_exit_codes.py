"""Exit codes: 2 when the command line or the configuration is wrong, 1 when a run fails."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from prism.devstack import DevstackError
from prism.pipeline.cli import EXIT_FAILURE, EXIT_USAGE, exit_code_of, main
from prism.pipeline.retry import BrokerUnavailable
from prism.pipeline.settings import SettingsError
from prism.sinks import LedgerConfigError, LedgerQueryError


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_bad_option_value_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tail", "--run", "r-1", "--timeout", "0"]) == EXIT_USAGE == 2
    err = capsys.readouterr().err
    assert err == "prism-pipeline tail: error: --timeout must be a number of seconds > 0, got 0.0\n"


def test_a_bad_setting_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PRISM_PARTITIONS", "0")
    assert main(["query", "SELECT 1"]) == EXIT_USAGE
    assert "PRISM_PARTITIONS='0'" in capsys.readouterr().err


def test_an_unreachable_ledger_is_a_runtime_failure_in_one_line() -> None:
    port = _closed_port()
    out = subprocess.run(
        [sys.executable, "-m", "prism.pipeline.cli", "query", "SELECT 1",
         "--clickhouse", f"http://127.0.0.1:{port}"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == EXIT_FAILURE == 1
    assert out.stderr.startswith("prism-pipeline query: error: could not reach ClickHouse")
    assert out.stderr.count("\n") == 1, out.stderr


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (ValueError("--batch-size must be >= 1"), EXIT_USAGE),
        (SettingsError("PRISM_PARTITIONS='0'"), EXIT_USAGE),
        (LedgerConfigError("bad DSN"), EXIT_USAGE),
        (LedgerQueryError("query failed"), EXIT_FAILURE),
        (BrokerUnavailable("not ready"), EXIT_FAILURE),
        (DevstackError("port taken"), EXIT_FAILURE),
        (OSError("disk full"), EXIT_FAILURE),
        (KeyError("bug"), EXIT_FAILURE),
    ],
)
def test_exit_code_of_each_kind_of_error(exc: BaseException, code: int) -> None:
    assert exit_code_of(exc) == code
