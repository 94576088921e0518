"""What a new user types wrong: each answer is one line naming what they gave.

Out-of-range numbers stop before the command does anything (exit 2), an error names the flag
the user gave rather than the variable it overrides, and ``--help`` shows examples.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from prism.pipeline.cli import EXIT_USAGE, build_parser, main

# The commands whose options these tests hold to the shared number types.
COMMANDS = (
    "ingest-file", "tail", "worker", "rebuild", "simulate", "dashboards", "devstack",
    "grants", "migrate", "prices", "schema",
)  # fmt: skip


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """The exit code and stderr of ``prism-pipeline argv``, as the shell would see them."""
    try:
        code = main(list(argv))
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else 1
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "flag", "shown"),
    [
        (["ingest-file", "missing.jsonl", "--batch-size", "0"], "--batch-size", "0"),
        (["ingest-file", "missing.jsonl", "--batch-size", "-5"], "--batch-size", "-5"),
        (["ingest-file", "missing.jsonl", "--batch-size", "many"], "--batch-size", "many"),
        (["rebuild", "--batch-size", "-5"], "--batch-size", "-5"),
        (["tail", "--follow", "--max-events", "0"], "--max-events", "0"),
        (["tail", "--run", "r-1", "--timeout", "-1"], "--timeout", "-1"),
        (["tail", "--run", "r-1", "--timeout", "nan"], "--timeout", "nan"),
        (["tail", "--run", "r-1", "--timeout", "soon"], "--timeout", "soon"),
        (["simulate", "--out", os.devnull, "--runs", "0"], "--runs", "0"),
        (["simulate", "--out", os.devnull, "--seed", "1.5"], "--seed", "1.5"),
        (["simulate", "--out", os.devnull, "--reorder-window", "-1"], "--reorder-window", "-1"),
        (["simulate", "--out", os.devnull, "--partitions", "0"], "--partitions", "0"),
        (["simulate", "--out", os.devnull, "--alert-threshold", "0"], "--alert-threshold", "0"),
        (["simulate", "--out", os.devnull, "--max-event-bytes", "5"], "--max-event-bytes", "5"),
        (["simulate", "--out", os.devnull, "--stale-after", "0"], "--stale-after", "0"),
        (["simulate", "--out", os.devnull, "--rate", "inf"], "--rate", "inf"),
        (["devstack", "kafka", "up", "--port", "0"], "--port", "0"),
        (["devstack", "kafka", "up", "--port", "70000"], "--port", "70000"),
        (["migrate", "--raw-event-ttl-days", "0"], "--raw-event-ttl-days", "0"),
    ],
)
def test_an_out_of_range_number_is_refused_in_one_line_naming_flag_and_value(
    argv: list[str], flag: str, shown: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _run(capsys, *argv)
    assert code == EXIT_USAGE, err
    assert len(err.splitlines()) == 1 and "usage:" not in err, err
    assert err.startswith(f"prism-pipeline {argv[0]}: error: ") and flag in err, err
    assert shown in err.split(flag, 1)[1], err


def test_a_batch_size_of_zero_is_refused_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = tmp_path / "events.jsonl"
    lines.write_text("")
    ledger = tmp_path / "ledger"
    code, err = _run(capsys, "ingest-file", str(lines), "--clickhouse", f"chdb://{ledger}",
                     "--batch-size", "0")  # fmt: skip
    assert code == EXIT_USAGE and "--batch-size" in err, err
    assert not ledger.exists()  # no ledger was opened, let alone written


def test_a_bad_database_name_is_refused_before_anything_is_created_or_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = tmp_path / "ledger"
    code, err = _run(capsys, "rebuild", "--database", "bad name", "--clickhouse",
                     f"chdb://{ledger}")  # fmt: skip
    assert code == EXIT_USAGE and "--database" in err and "'bad name'" in err, err
    assert not ledger.exists()  # the rebuild opened no ledger to find out
    with pytest.raises(SystemExit) as done:
        main(["grants", "--database", "bad name"])
    out = capsys.readouterr()
    assert done.value.code == EXIT_USAGE and "'bad name'" in out.err
    assert out.out == ""  # not half a script: the header was printed before the error


def test_options_that_bound_each_other_are_named(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run(capsys, "simulate", "--out", os.devnull, "--runs", "3",
                     "--limit-death-burst", "5")  # fmt: skip
    assert code == EXIT_USAGE
    assert err == "prism-pipeline simulate: error: --limit-death-burst 5 is more than --runs 3\n"
    code, err = _run(capsys, "simulate", "--out", os.devnull, "--hostile", "0.1",
                     "--partitions", "1")  # fmt: skip
    assert code == EXIT_USAGE and "--hostile needs --partitions >= 2" in err, err


def test_no_option_of_these_commands_takes_an_unbounded_int_or_float() -> None:
    """The class, not the instances: a plain ``type=int``/``float`` lets 0 and -5 through."""
    loose = []
    stack = [(name, parser) for name, parser in _commands(build_parser()) if name in COMMANDS]
    while stack:
        name, parser = stack.pop()
        for action in parser._actions:
            if action.type in (int, float):
                loose.append(f"{name} {'/'.join(action.option_strings) or action.dest}")
            if isinstance(action, argparse._SubParsersAction):
                stack += [(f"{name} {n}", p) for n, p in action.choices.items()]
    assert loose == []


def _commands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return list(sub.choices.items())


@pytest.mark.parametrize(
    ("argv", "flag", "variable"),
    [
        (["ingest-file", "x.jsonl", "--clickhouse", "bogus://x"], "--clickhouse", "DSN"),
        (["worker", "--clickhouse", "bogus://x"], "--clickhouse", "DSN"),
        (["worker", "--bootstrap", "no-port"], "--bootstrap", "BOOTSTRAP_SERVERS"),
        (["worker", "--topic-prefix", "a b"], "--topic-prefix", "TOPIC_PREFIX"),
        (["tail", "--run", "r-1", "--clickhouse", "bogus://x"], "--clickhouse", "DSN"),
        (["tail", "--run", "r-1", "--bootstrap", "no-port"], "--bootstrap", "BOOTSTRAP"),
        (["rebuild", "--clickhouse", "bogus://x"], "--clickhouse", "DSN"),
        (["simulate", "--runs", "1", "--kafka", "no-port"], "--kafka", "BOOTSTRAP"),
    ],
)
def test_an_error_names_the_flag_the_user_gave_not_the_variable(
    argv: list[str], flag: str, variable: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _run(capsys, *argv)
    assert code == EXIT_USAGE, err
    assert f"{flag}=" in err and "PRISM_" not in err, err


def test_an_error_names_the_variable_when_the_value_came_from_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PRISM_CLICKHOUSE_DSN", "bogus://x")
    code, err = _run(capsys, "ingest-file", "x.jsonl")
    assert code == EXIT_USAGE and "PRISM_CLICKHOUSE_DSN='bogus://x'" in err, err
    monkeypatch.setenv("PRISM_KAFKA_PORT", "70000")
    code, err = _run(capsys, "devstack", "kafka", "status")
    assert code == EXIT_USAGE and "PRISM_KAFKA_PORT" in err and "'70000'" in err, err


@pytest.mark.parametrize("command", ["ingest-file", "tail", "rebuild", "worker"])
def test_help_shows_examples(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    text = capsys.readouterr().out
    assert done.value.code == 0
    examples = text.split("\nexamples:\n", 1)[1].splitlines()
    assert sum(line.startswith(f"  prism-pipeline {command}") for line in examples) >= 2, text
    assert max(len(line) for line in text.splitlines()) <= 100  # wrapped, not one long line


def test_a_path_that_cannot_be_used_is_named_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no-such-dir" / "fleet.jsonl"
    code, err = _run(capsys, "simulate", "--runs", "5", "--out", str(missing))
    assert code == EXIT_USAGE, err
    assert err == (
        f"prism-pipeline simulate: error: --out {missing}: the directory {missing.parent} "
        "does not exist\n"
    )
    code, err = _run(capsys, "simulate", "--runs", "5", "--manifest", str(tmp_path))
    assert code == EXIT_USAGE and f"--manifest {tmp_path} is a directory" in err, err
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    code, err = _run(capsys, "dashboards", "build", "--out", str(a_file))
    assert code == EXIT_USAGE and f"--out {a_file} is a file" in err, err


def test_tail_from_a_ledger_that_is_not_there_creates_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = tmp_path / "ledger"
    code, err = _run(capsys, "tail", "--run", "r-1", "--from-ledger", "--clickhouse",
                     f"chdb://{ledger}")  # fmt: skip
    assert code == EXIT_USAGE and f"no ledger at {ledger}" in err, err
    assert not ledger.exists()


def test_a_flag_given_is_used_instead_of_a_bad_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PRISM_CLICKHOUSE_DSN", "bogus://x")
    for name in ("WRITER", "READER", "GRAFANA"):
        monkeypatch.delenv(f"CLICKHOUSE_{name}_PASSWORD", raising=False)
    code, err = _run(capsys, "grants", "--execute", "--clickhouse", f"chdb://{tmp_path / 'l'}")
    assert code == EXIT_USAGE and "needs the account passwords" in err, err
    assert "PRISM_CLICKHOUSE_DSN" not in err


def test_an_id_that_is_empty_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run(capsys, "tail", "--run", " ")
    assert (code, err) == (EXIT_USAGE, "prism-pipeline tail: error: --run needs an id, got ' '\n")
    code, err = _run(capsys, "tail", "--operation", "")
    assert code == EXIT_USAGE and "--operation needs an id" in err, err


def test_simulate_to_a_broker_nobody_runs_fails_in_one_line(tmp_path: Path) -> None:
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nobody listens there
    out = subprocess.run(
        [sys.executable, "-m", "prism.pipeline.cli", "simulate", "--runs", "5",
         "--kafka", f"127.0.0.1:{port}"],
        capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 1
    assert out.stderr.startswith("prism-pipeline simulate: error: cannot connect to Kafka")
    assert out.stderr.count("\n") == 1, out.stderr  # not the client's own ERROR line first
