"""A closed pipe ends a command quietly, and ``-v`` works before or after the command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from prism.pipeline.cli import COMMANDS, EXIT_BROKEN_PIPE, build_parser, main
from tests.unit.test_cli_inputs import _commands


@pytest.mark.parametrize("unbuffered", ["1", ""])
def test_a_reader_that_stops_reading_ends_the_command_quietly(
    unbuffered: str, tmp_path: Path
) -> None:
    """`prism-pipeline simulate ... | head`: no BrokenPipeError traceback, exit 141.

    Unbuffered, the first print meets the closed pipe; buffered, the flush at the end does.
    """
    env = {**os.environ, "PYTHONUNBUFFERED": unbuffered}
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line is written
    try:
        out = subprocess.run(
            [sys.executable, "-m", "prism.pipeline.cli", "simulate", "--runs", "20",
             "--out", str(tmp_path / "fleet.jsonl")],
            stdout=write, stderr=subprocess.PIPE, text=True, timeout=120, check=False, env=env,
        )  # fmt: skip
    finally:
        os.close(write)
    assert (out.returncode, out.stderr) == (EXIT_BROKEN_PIPE, "")


@pytest.mark.parametrize(
    "argv",
    [
        ["-v", "billing", "--from", "2026-11-01", "--to", "2026-12-01"],
        ["billing", "-v", "--from", "2026-11-01", "--to", "2026-12-01"],
        ["billing", "--from", "2026-11-01", "--to", "2026-12-01", "--verbose"],
        ["prices", "load", "-v", "prices.yaml"],
        ["tail", "--run", "r-1", "-v"],
    ],
)
def test_verbose_works_before_and_after_the_command(argv: list[str]) -> None:
    assert build_parser().parse_args(argv).verbose is True


def test_without_verbose_it_is_off() -> None:
    args = build_parser().parse_args(["billing", "--from", "2026-11-01", "--to", "2026-12-01"])
    assert args.verbose is False


def test_verbose_after_the_command_shows_the_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["ingest-file", "no-such-file.jsonl"]) == 1
    with pytest.raises(FileNotFoundError, match="no-such-file"):
        main(["ingest-file", "-v", "no-such-file.jsonl"])


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_command_alone_parses_as_in_the_whole_tree(command: str) -> None:
    """The branch built for one command is the same branch as in the whole tree."""
    whole = dict(_commands(build_parser()))[command].format_help()
    assert dict(_commands(build_parser(["-v", command])))[command].format_help() == whole
    assert [name for name, _ in _commands(build_parser([command]))] == [
        c for c, m in COMMANDS.items() if m == COMMANDS[command]
    ]


@pytest.mark.parametrize(
    "argv", [[], ["--help"], ["-h", "billing"], ["-v"], ["no-such-command", "billing"]]
)
def test_without_a_command_first_every_command_is_there(argv: list[str]) -> None:
    assert [name for name, _ in _commands(build_parser(argv))] == list(COMMANDS)


def test_a_billing_report_does_not_import_the_other_commands() -> None:
    """What its start costs: the dashboards' SDK, the simulator and the models stay out."""
    code = (
        "import sys; from prism.pipeline.cli import build_parser; "
        "build_parser(['billing', '--from', '-7d']); "
        "print(sorted(m for m in ('prism.dashboards', 'prism.runtime.simulator', "
        "'prism.schemas', 'prism.devstack') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout
