"""``prism-pipeline query "SQL"``: print a query's result against the configured ledger.

Read-only unless ``--allow-writes``: ClickHouse's own parser decides what the statement is,
and only one SELECT/WITH/SHOW TABLES/SHOW CREATE/DESCRIBE/EXISTS/EXPLAIN whose every table
is one of the ledger database's own tables and views runs, with ClickHouse's
``readonly = 1`` (``sinks._readonly``). Handy with the embedded chDB engine, which one
process owns at a time: run it while no worker holds the same path, or point
``--clickhouse`` at a server.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from prism.pipeline.commands._output import render

__all__ = ["ExamplesFormatter", "add_connection_args", "connection", "register", "render"]

FORMATS = ("table", "vertical", "csv", "json")
_PARAM_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)


class ExamplesFormatter(argparse.HelpFormatter):
    """Wraps the description as argparse does; an epilog of examples keeps its lines."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith("examples:"):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "query",
        help="run one SQL query against the ledger and print the result",
        description=(
            "Runs SQL on the ledger (default database from PRISM_CLICKHOUSE_DATABASE, so "
            "`SELECT * FROM runs` works) and prints the rows. Read-only by default: "
            "ClickHouse parses the statement, and only one SELECT, WITH, SHOW TABLES, SHOW "
            "CREATE TABLE, DESCRIBE, EXISTS or EXPLAIN SELECT whose every table is one of the "
            "ledger's own tables and views runs, with ClickHouse's readonly=1. Anything else "
            "is refused with the reason: writes, DDL, SET, KILL, table functions (file(), "
            "url(), s3(), remote(), numbers(), ...), other databases (system.*), SETTINGS, "
            "INTO OUTFILE, several statements. A statement that does not parse gets "
            "ClickHouse's syntax error."
        ),
        epilog=(
            "examples:\n"
            '  prism-pipeline query "SELECT status, count() AS runs FROM runs GROUP BY status"\n'
            '  prism-pipeline query "SELECT * FROM usage WHERE tenant_id = {tenant:String}" '
            "--param tenant=acme-corp --format vertical\n"
            '  prism-pipeline query "SHOW TABLES"'
        ),
        formatter_class=ExamplesFormatter,
    )
    p.add_argument("sql", help='the statement, e.g. "SELECT status, count() FROM runs GROUP BY 1"')
    add_connection_args(p)
    p.add_argument(
        "--format",
        choices=FORMATS,
        default="table",
        help="output format: table, vertical (one block per row, for wide rows), csv, json",
    )
    p.add_argument(
        "--param",
        dest="params",
        action="append",
        default=[],
        type=_param,
        metavar="NAME=VALUE",
        help="a query parameter, repeatable: --param tenant=acme fills {tenant:String} in the "
        "SQL (ClickHouse parses the value as the type the placeholder names)",
    )
    p.add_argument(
        "--allow-writes",
        action="store_true",
        help="operators only: run any statement (INSERT, ALTER, DROP, ...) without the "
        "read-only check; the account's own grants still apply",
    )
    p.set_defaults(func=_run)


def add_connection_args(p: argparse.ArgumentParser) -> None:
    """``--clickhouse`` and ``--database``, defaulting to the settings (PRISM_CLICKHOUSE_*)."""
    p.add_argument(
        "--clickhouse",
        metavar="DSN",
        help="ledger DSN: chdb://<path> or http(s)://user:pw@host:port "
        "(default PRISM_CLICKHOUSE_DSN, chdb://./.data/ledger)",
    )
    p.add_argument("--database", help="ledger database (default PRISM_CLICKHOUSE_DATABASE, prism)")


def connection(args: argparse.Namespace, *, read_only: bool = False) -> tuple[Any, str]:
    """The client and database the arguments (or the settings) name.

    ``read_only``: the command only reads, so nothing may be created: a chDB path or a
    database that holds no ledger stops it with ``no ledger at PATH (...)``.
    """
    from prism.pipeline.settings import load_settings
    from prism.sinks import connect

    settings = load_settings()
    database = args.database or settings.clickhouse_database
    dsn = args.clickhouse or settings.clickhouse_dsn
    return connect(dsn, database, create=not read_only), database


def _param(text: str) -> tuple[str, str]:
    match = _PARAM_RE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not NAME=VALUE (NAME a plain identifier, e.g. tenant=acme)"
        )
    return match[1], match[2]


def _parameters(pairs: list[tuple[str, str]]) -> dict[str, Any] | None:
    """``--param`` pairs as a dict; a name given twice is a mistake (ValueError)."""
    out: dict[str, Any] = {}
    for name, value in pairs:
        if name in out and out[name] != value:
            raise ValueError(f"--param {name} is given twice ({out[name]!r} and {value!r})")
        out[name] = value
    return out or None


def _run(args: argparse.Namespace) -> int:
    from prism.sinks import LedgerQueryError, LedgerReadOnlyError, query, read_only_query
    from prism.sinks._readonly import QuerySyntaxError

    params = _parameters(args.params)
    unused = [n for n in params or {} if not re.search(r"\{\s*" + n + r"\s*:", args.sql)]
    if unused:  # the driver would also read a '%' of the SQL as a format character
        raise ValueError(
            f"--param {unused[0]} fills nothing: the SQL has no {{{unused[0]}:Type}} placeholder"
        )
    client, database = connection(args, read_only=not args.allow_writes)
    if args.allow_writes:
        result = query(client, args.sql, params)
    else:
        try:
            result = read_only_query(client, args.sql, params, database=database)
        except QuerySyntaxError:
            raise
        except LedgerReadOnlyError as exc:
            raise LedgerReadOnlyError(f"refused: {exc}") from None
        except LedgerQueryError as exc:
            if "readonly" not in str(exc):
                raise
            raise LedgerQueryError(
                f"{exc}; `query` runs with readonly=1 by default: an operator who means to "
                "change the ledger adds --allow-writes"
            ) from None
    print(render(result.columns, result.rows, args.format))
    return 0
