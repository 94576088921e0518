"""The ``prism-pipeline`` command line: one argparse tree, one module per command group.

Each module in ``pipeline/commands/`` exposes ``register(subparsers)`` which adds its
sub-command(s) and sets ``func`` (a callable taking the parsed ``argparse.Namespace`` and
returning an exit code). An error prints one line (``-v``, before or after the command,
shows the traceback) and exits with ``EXIT_USAGE`` (2, as argparse does) when the command
line or the configuration is wrong, or ``EXIT_FAILURE`` (1) when the command failed while
running (broker, ledger, files). A bad option value is one line too, without the usage.
An error names what the user gave: the flag (``--clickhouse``) when a flag set the value,
the variable (``PRISM_CLICKHOUSE_DSN``) otherwise. Ctrl-C exits 130. A reader of stdout
that stops reading (``| head``) ends the command quietly with ``EXIT_BROKEN_PIPE`` (141, as
a Unix tool killed by SIGPIPE).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import re
import sys
from collections.abc import Sequence
from typing import NoReturn

from prism.pipeline.commands._args import flag_names

__all__ = [
    "COMMANDS",
    "EXIT_BROKEN_PIPE",
    "EXIT_FAILURE",
    "EXIT_USAGE",
    "build_parser",
    "exit_code_of",
    "main",
]

EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE

# Libraries that log every retry of a connection the command reports itself.
_NOISY_LOGGERS = ("urllib3", "clickhouse_connect")


def _quiet_libraries(record: logging.LogRecord) -> bool:
    """A filter on the output: their records below ERROR are dropped. Not their loggers'
    levels, which a library may set when it is imported (clickhouse-connect sets urllib3's),
    and a command imports its libraries after this is set up."""
    return record.levelno >= logging.ERROR or not any(
        record.name == name or record.name.startswith(f"{name}.") for name in _NOISY_LOGGERS
    )


# Errors that mean "fix the command line or the configuration" (module, class). Looked up
# in sys.modules: an exception of a class whose module was never imported cannot occur.
_USAGE_ERRORS = (
    ("prism.pipeline.settings", "SettingsError"),
    ("prism.sinks._errors", "LedgerConfigError"),
    ("prism.sinks._errors", "LedgerReadOnlyError"),
    ("prism.pipeline.alerting", "WebhookConfigError"),
    ("prism.runtime.simulator._config", "SimulatorConfigError"),
    ("prism.devstack.faults", "FaultSpecError"),
)

# Each command and the module that registers it, in the order they appear in --help.
COMMANDS = {
    "devstack": "prism.pipeline.commands.devstack",
    "worker": "prism.pipeline.commands.worker",
    "ingest-file": "prism.pipeline.commands.ingest_file",
    "schema": "prism.pipeline.commands.schema",
    "migrate": "prism.pipeline.commands.migrate",
    "grants": "prism.pipeline.commands.grants",
    "query": "prism.pipeline.commands.query",
    "billing": "prism.pipeline.commands.billing",
    "invoice": "prism.pipeline.commands.billing",
    "budgets": "prism.pipeline.commands.budgets",
    "prices": "prism.pipeline.commands.prices",
    "report": "prism.pipeline.commands.report",
    "traces": "prism.pipeline.commands.traces",
    "dashboards": "prism.pipeline.commands.dashboards",
    "simulate": "prism.pipeline.commands.simulate",
    "tail": "prism.pipeline.commands.tail",
    "rebuild": "prism.pipeline.commands.rebuild",
}


class _Parser(argparse.ArgumentParser):
    """argparse, with a bad value of one option reported in one line (no usage)."""

    def error(self, message: str) -> NoReturn:
        if message.startswith("argument "):  # about one option: its name says where to look
            self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")
        super().error(message)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The command tree; for an ``argv`` that names a command, that command's branch alone.

    A command module imports what its command runs (the dashboards' SDK, the simulator,
    the contract's models), so importing all of them cost a ``billing`` report about 0.3 s
    of its 1.3 s (bench/README.md). Without a command (``--help``, a typo) every command
    is there.
    """
    parser = _Parser(
        prog="prism-pipeline",
        description=(
            "Observability and metering pipeline for Prism agent runtimes: "
            "Kafka -> run semantics -> ClickHouse ledger. "
            "Settings come from PRISM_* environment variables (see README)."
        ),
    )
    parser.add_argument("-v", "--verbose", action="store_true", help=_VERBOSE_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in _modules_for(argv):
        importlib.import_module(module).register(sub)
    _verbose_everywhere(sub)
    return parser


def _modules_for(argv: Sequence[str] | None) -> list[str]:
    """The command modules to register: the one ``argv``'s command is in, or all of them.

    The command is ``argv``'s first word that is not an option: the options before a
    command (``-v``, ``-h``) take no value. A help asked for before the command lists them
    all.
    """
    for word in argv or ():
        if word in ("-h", "--help"):
            break
        if not word.startswith("-"):
            if word in COMMANDS:
                return [COMMANDS[word]]
            break
    return list(dict.fromkeys(COMMANDS.values()))


_VERBOSE_HELP = "log at DEBUG level and show the traceback of an error"


def _verbose_everywhere(sub: argparse._SubParsersAction) -> None:
    """``-v`` after the command too (``prism-pipeline billing -v ...``), at every level.

    SUPPRESS as the default: a command's parser sets ``verbose`` only when ``-v`` follows
    the command, so a ``-v`` before it is not overwritten with False.
    """
    for parser in sub.choices.values():
        parser.add_argument(
            "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=_VERBOSE_HELP
        )
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                _verbose_everywhere(action)


def exit_code_of(exc: BaseException) -> int:
    """``EXIT_USAGE`` for a bad option or setting, ``EXIT_FAILURE`` for anything else.

    Commands check their options with a plain ``ValueError``; the configuration errors of
    each package are listed in ``_USAGE_ERRORS``.
    """
    if type(exc) is ValueError or isinstance(exc, argparse.ArgumentTypeError):
        return EXIT_USAGE
    for module, name in _USAGE_ERRORS:
        cls = getattr(sys.modules.get(module), name, None)
        if isinstance(cls, type) and isinstance(exc, cls):
            return EXIT_USAGE
    return EXIT_FAILURE


def _in_user_terms(text: str, args: argparse.Namespace) -> str:
    """``text`` with each ``PRISM_*`` variable the user overrode by a flag named as that flag."""
    for variable, flag in flag_names(args).items():
        text = re.sub(rf"\b{variable}\b", flag, text)
    return text


def _quiet_broken_pipe() -> int:
    """The reader of stdout is gone (``| head``): stop without a word.

    Python flushes stdout again at exit; pointing it at devnull keeps that flush from
    raising a second BrokenPipeError (the recipe of Python's signal module docs).
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return EXIT_BROKEN_PIPE


def main(argv: Sequence[str] | None = None) -> int:
    try:
        try:
            return _main(argv)
        finally:  # a reader that left (`| head`) shows here, not in Python's flush at exit
            sys.stdout.flush()
    except BrokenPipeError:
        return _quiet_broken_pipe()


def _main(argv: Sequence[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:  # their retries end in our one-line error; -v shows them
        for handler in logging.getLogger().handlers:
            handler.addFilter(_quiet_libraries)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if args.verbose or isinstance(exc, BrokenPipeError):
            raise
        text = _in_user_terms(str(exc).strip() or type(exc).__name__, args)
        print(f"prism-pipeline {args.command}: error: {text}", file=sys.stderr)
        return exit_code_of(exc)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
