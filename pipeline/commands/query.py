"""``prism-pipeline query "SQL"``: print a query's result against the configured ledger.

Read-only unless ``--allow-writes``: the statement is checked (one SELECT/WITH/SHOW/
DESCRIBE/EXPLAIN/EXISTS, no writing keyword, no table function reading files or URLs) and
runs with ClickHouse's ``readonly = 1``. Handy with the embedded chDB engine, which one
process owns at a time: run it while no worker holds the same path, or point
``--clickhouse`` at a server.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
from collections.abc import Sequence
from datetime import date, datetime
from decimal import Decimal
from typing import Any

__all__ = ["register", "render"]

FORMATS = ("table", "csv", "json")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "query",
        help="run one SQL query against the ledger and print the result",
        description=(
            "Runs SQL on the ledger (default database from PRISM_CLICKHOUSE_DATABASE, so "
            "`SELECT * FROM runs` works) and prints the rows. Read-only by default: one "
            "SELECT, WITH, SHOW, DESCRIBE, EXPLAIN or EXISTS statement, run with ClickHouse's "
            "readonly=1; writes, DDL and table functions that read files or URLs (file(), "
            "url(), s3(), remote(), ...) are refused."
        ),
    )
    p.add_argument("sql", help='the statement, e.g. "SELECT status, count() FROM runs GROUP BY 1"')
    add_connection_args(p)
    p.add_argument("--format", choices=FORMATS, default="table", help="output format")
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


def connection(args: argparse.Namespace) -> tuple[Any, str]:
    """The client and database the arguments (or the settings) name."""
    from prism.pipeline.settings import load_settings
    from prism.sinks import connect

    settings = load_settings()
    database = args.database or settings.clickhouse_database
    return connect(args.clickhouse or settings.clickhouse_dsn, database), database


def render(columns: Sequence[str], rows: Sequence[Sequence[Any]], fmt: str) -> str:
    """Rows as an aligned text table, CSV with a header, or a JSON array of objects."""
    if fmt == "json":
        objects = [dict(zip(columns, row, strict=True)) for row in rows]
        return json.dumps(objects, default=_json_value, ensure_ascii=False, indent=2)
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([[_text(v, null="") for v in row] for row in rows])
        return out.getvalue().rstrip("\n")
    cells = [[_text(v) for v in row] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(lines)


def _text(value: Any, null: str = "NULL") -> str:
    if value is None:
        return null
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="backslashreplace")
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, default=_json_value, ensure_ascii=False)
    return str(value)


def _json_value(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)  # exact: a float would round money
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="backslashreplace")
    raise TypeError(f"cannot print a {type(value).__name__} as JSON: {value!r}")


def _run(args: argparse.Namespace) -> int:
    from prism.sinks import (
        LedgerQueryError,
        LedgerReadOnlyError,
        check_read_only,
        query,
        read_only_query,
    )

    if not args.allow_writes:
        try:
            check_read_only(args.sql)  # before connecting: a refused statement touches nothing
        except LedgerReadOnlyError as exc:
            raise LedgerReadOnlyError(
                f"refused: {exc}. `query` is read-only by default; an operator who means to "
                "change the ledger adds --allow-writes"
            ) from None
    client, _ = connection(args)
    if args.allow_writes:
        result = query(client, args.sql)
    else:
        try:
            result = read_only_query(client, args.sql)
        except LedgerQueryError as exc:
            if "readonly" not in str(exc):
                raise
            raise LedgerQueryError(
                f"{exc}; `query` runs with readonly=1 by default: an operator who means to "
                "change the ledger adds --allow-writes"
            ) from None
    print(render(result.columns, result.rows, args.format))
    return 0
