"""The command line of a benchmark module run alone (``python -m bench.<module>``).

Each module's docstring says what it measures; its first paragraph is the ``--help``
description, and the module names its own examples. ``python -m bench`` runs them all.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["parser", "positive_int", "print_rows"]


def parser(module: str, doc: str | None, examples: Sequence[str]) -> argparse.ArgumentParser:
    """A parser for ``python -m bench.<module>`` with ``--quick`` and the examples.

    >>> p = parser("bench_x", "X benchmark: what it times.\\n\\nMore.", ["--quick"])
    >>> p.parse_args(["--quick"]).quick, p.prog
    (True, 'python -m bench.bench_x')
    """
    first = (doc or "").strip().split("\n\n")[0]
    p = argparse.ArgumentParser(
        prog=f"python -m bench.{module}",
        description=first + "\n(The module's docstring says what each row measures.)",
        epilog="examples:\n"
        + "\n".join(f"  python -m bench.{module} {e}".rstrip() for e in examples),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="smaller sizes, for a first look")
    return p


def positive_int(text: str) -> int:
    """An argument that must be a whole number above 0 (``_`` and ``,`` allowed).

    >>> positive_int("20_000"), positive_int("1,500")
    (20000, 1500)
    """
    try:
        value = int(text.replace("_", "").replace(",", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be 1 or more")
    return value


def print_rows(rows: Iterable[dict[str, Any]], metric_width: int = 34) -> None:
    """One line per row: bench, metric, value, unit."""
    for r in rows:
        print(f"{r['bench']:<9} {r['metric']:<{metric_width}} {r['value']:>14,.3f} {r['unit']}")
