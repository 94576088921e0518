"""``prism-pipeline prices load FILE`` / ``prices list``: the price book billing uses.

The price book prices reported usage that arrived without a cost, at the price valid at
the usage row's event time (sinks/BILLING.md). Loading checks every row first and loads
nothing when one is wrong; loading the same file again writes nothing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from prism.pipeline.commands.billing import add_output_args, emit
from prism.pipeline.commands.query import add_connection_args, connection

__all__ = ["register"]

_LIST_COLUMNS = ("provider", "model", "token_kind", "currency", "valid_from", "unit_price",
                 "per_tokens")  # fmt: skip


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "prices",
        help="load or list the price book (prices for reported usage without a cost)",
        description=(
            "The price book: a unit price per provider, model, token kind (input, output, "
            "cache_read, cache_write) and currency, valid from a time on. Billing prices "
            "reported usage that arrived without a cost with the price valid at its event "
            "time; estimates are never priced. Load it as an operator (the ledger's reader "
            "account cannot write)."
        ),
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    load = actions.add_parser(
        "load",
        help="check a YAML or CSV price file and load its new or changed prices",
        description=(
            "FILE is .yaml/.yml (a list, or `prices:` and a list) or .csv (a header line) "
            "with the fields provider, model, token_kind, unit_price, currency, valid_from "
            "and optionally per_tokens (default 1000000: unit_price is per million tokens). "
            "valid_from is a date (midnight UTC) or a time with a UTC offset. Every row is "
            "checked first; one mistake loads nothing and each is named with its line. "
            "Loading the same file again changes nothing; a changed price of the same key "
            "replaces the old one."
        ),
    )
    load.add_argument("file", type=Path, metavar="FILE", help="the price file")
    load.add_argument("--check", action="store_true", help="only check the file; load nothing")
    add_connection_args(load)
    load.set_defaults(func=_load)
    listing = actions.add_parser(
        "list", help="print the current price book", description="The current price book."
    )
    add_output_args(listing)
    add_connection_args(listing)
    listing.set_defaults(func=_list)


def _load(args: argparse.Namespace) -> int:
    from prism.sinks import load_prices, read_price_file

    rows = read_price_file(args.file)
    if args.check:
        print(f"{args.file}: {len(rows)} price(s), no mistakes")
        return 0
    client, database = connection(args)
    summary = load_prices(client, database, rows, source=str(args.file))
    print(
        f"{args.file}: {summary.new} new, {summary.changed} changed, "
        f"{summary.unchanged} unchanged price(s) in {database}.prices"
    )
    return 0


def _list(args: argparse.Namespace) -> int:
    from prism.sinks import price_book

    client, database = connection(args, read_only=True)  # a mistyped path creates nothing
    book = price_book(client, database)
    emit(args, list(_LIST_COLUMNS), [tuple(getattr(r, c) for c in _LIST_COLUMNS) for r in book])
    if not book and args.format == "table":
        print("the price book is empty: load one with `prism-pipeline prices load FILE`",
              file=sys.stderr)  # fmt: skip
    return 0
