"""What every command shares about its options: numbers within bounds, ports, settings from flags.

``whole`` and ``number`` build argparse ``type=`` functions that refuse a value out of its
bounds (and NaN or infinity) while the command line is read, so a bad value stops the
command before it does anything, in one line that names the option and the value, with
exit code 2::

    prism-pipeline ingest-file: error: argument --batch-size: must be a whole number >= 1, got '0'

``load_settings_from`` lays the options the user gave over the ``PRISM_*`` environment and
remembers which flag stands for which variable, so that an error names ``--clickhouse``
rather than ``PRISM_CLICKHOUSE_DSN`` when the value came from ``--clickhouse``
(``cli.main`` swaps the names; ``flag_names`` gives them).

Example::

    p.add_argument("--batch-size", type=whole(1), default=5000)
    p.add_argument("--port", type=PORT)
    settings = load_settings_from(args, {"--clickhouse": "clickhouse_dsn"})
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prism.pipeline.settings import Settings

__all__ = ["PORT", "flag_names", "identifier", "load_settings_from", "number", "whole"]

# The attribute of the parsed arguments that maps a PRISM_* variable to the flag given for it.
_FLAG_NAMES = "_prism_flag_names"


def _bounds(low: float | None, high: float | None, *, above: bool = False) -> str:
    if low is not None and high is not None:
        return f"> {low} and <= {high}" if above else f"from {low} to {high}"
    if low is not None:
        return f"{'>' if above else '>='} {low}"
    return f"<= {high}" if high is not None else ""


def whole(low: int | None = None, high: int | None = None) -> Callable[[str], int]:
    """A ``type=`` for a whole number in ``low..high`` (either bound may be left open)."""
    wanted = " ".join(filter(None, ("a whole number", _bounds(low, high))))

    def parse(text: str) -> int:
        refused = argparse.ArgumentTypeError(f"must be {wanted}, got {text!r}")
        try:
            value = int(text)
        except ValueError:
            raise refused from None
        if (low is not None and value < low) or (high is not None and value > high):
            raise refused
        return value

    parse.__name__ = "whole number"  # what argparse calls the type in its own messages
    return parse


def number(
    low: float | None = None, high: float | None = None, *, above: bool = False
) -> Callable[[str], float]:
    """A ``type=`` for a finite number ``>= low`` (``> low`` when ``above``) and ``<= high``."""
    wanted = " ".join(filter(None, ("a number", _bounds(low, high, above=above))))

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        too_low = low is not None and (value <= low if above else value < low)
        if not math.isfinite(value) or too_low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text!r}")
        return value

    parse.__name__ = "number"
    return parse


PORT = whole(1, 65535)

_IDENTIFIER_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


def identifier(text: str) -> str:
    """A ``type=`` for a ClickHouse database name: a plain identifier, as the ledger needs."""
    if not _IDENTIFIER_RE.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"must be a plain identifier ([A-Za-z_][A-Za-z0-9_]*, at most 64 chars), got {text!r}"
        )
    return text


def load_settings_from(args: argparse.Namespace, options: Mapping[str, str]) -> Settings:
    """The settings, with each option of ``options`` (flag -> setting field) the user gave.

    An option counts as given when its value is not None (an empty value is given, and
    refused by the settings by its flag's name). The flags given are kept on ``args`` for
    ``flag_names``.
    """
    from prism.pipeline.settings import load_settings

    overrides: dict[str, object] = {}
    named: dict[str, str] = {}
    for flag, field in options.items():
        value = getattr(args, flag.lstrip("-").replace("-", "_"), None)
        if value is not None:
            overrides[field] = value
            named[f"PRISM_{field.upper()}"] = flag
    setattr(args, _FLAG_NAMES, {**flag_names(args), **named})
    return load_settings(**overrides)


def flag_names(args: argparse.Namespace) -> dict[str, str]:
    """``PRISM_*`` variable -> the flag the user gave instead, for the settings loaded so far."""
    return dict(getattr(args, _FLAG_NAMES, {}))
