"""The ``prism-pipeline`` command line: one argparse tree, one module per command group.

Each module in ``pipeline/commands/`` exposes ``register(subparsers)`` which adds its
sub-command(s) and sets ``func`` (a callable taking the parsed ``argparse.Namespace`` and
returning an exit code). The packages' own errors (settings, ledger, replay, contract...)
print one line instead of a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

__all__ = ["build_parser", "main"]

# Command modules, in the order they appear in --help.
COMMAND_MODULES = [
    "prism.pipeline.commands.devstack",
    "prism.pipeline.commands.worker",
    "prism.pipeline.commands.ingest_file",
    "prism.pipeline.commands.schema",
    "prism.pipeline.commands.migrate",
    "prism.pipeline.commands.grants",
    "prism.pipeline.commands.query",
    "prism.pipeline.commands.billing",
    "prism.pipeline.commands.dashboards",
    "prism.pipeline.commands.simulate",
    "prism.pipeline.commands.tail",
    "prism.pipeline.commands.rebuild",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="prism-pipeline",
        description=(
            "Observability and metering pipeline for Prism agent runtimes: "
            "Kafka -> run semantics (faust-streaming) -> ClickHouse ledger. "
            "Settings come from PRISM_* environment variables (see README)."
        ),
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except (ValueError, RuntimeError, OSError) as exc:
        # Our error bases derive from these; print the message, not a traceback.
        if args.verbose:
            raise
        print(f"prism-pipeline {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
