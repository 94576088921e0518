"""Read-only ad hoc SQL: a statement check, then ClickHouse's own ``readonly`` setting.

Two layers, so neither alone has to be perfect:

1. ``check_read_only(sql)`` refuses, before anything reaches ClickHouse, a statement that
   is not one ``SELECT``/``WITH``/``SHOW``/``DESCRIBE``/``EXPLAIN``/``EXISTS``, that names a
   writing keyword (``INSERT``, ``ALTER``, ``DROP``, ``CREATE``, ``TRUNCATE``, ``RENAME``,
   ``GRANT``, ``SYSTEM``, ``OPTIMIZE``, ``INTO OUTFILE``...) outside string literals and
   comments, or calls a table function that reads files, URLs or other servers
   (``file()``, ``url()``, ``s3()``, ``remote()``...);
2. ``read_only_query`` runs what passed with ``readonly = 1``, which ClickHouse enforces
   (no writes, no DDL, no table functions, no setting changes). On chDB the query runs on
   a handle of its own, since chDB keeps a failed query's ``readonly`` on its handle.
"""

from __future__ import annotations

import re
from typing import Any

import clickhouse_connect
from clickhouse_connect.driver.client import Client

from prism.sinks._client import database_exists
from prism.sinks._errors import LedgerQueryError, LedgerReadOnlyError
from prism.sinks._queries import QueryResult, query

__all__ = ["READ_STATEMENTS", "check_read_only", "read_only_query"]

READ_STATEMENTS = frozenset({"select", "with", "show", "describe", "desc", "explain", "exists"})

# Words no read statement holds except as an identifier (SYSTEM is refused as a statement; a
# query may read system.* tables). SHOW CREATE is the one read that says CREATE.
_WRITE_KEYWORDS = frozenset(
    {
        "insert", "alter", "drop", "create", "truncate", "rename", "grant", "revoke",
        "optimize", "delete", "update", "attach", "detach", "kill", "exchange", "undrop",
        "backup", "restore", "outfile",
    }
)  # fmt: skip

# Table functions (and the scalar file()) that read outside the ledger or run programs.
_OUTSIDE_FUNCTIONS = frozenset(
    {
        "file", "filecluster", "url", "urlcluster", "s3", "s3cluster", "gcs", "oss", "cosn",
        "hdfs", "hdfscluster", "azureblobstorage", "azureblobstoragecluster", "remote",
        "remotesecure", "cluster", "clusterallreplicas", "mysql", "postgresql", "sqlite",
        "mongodb", "redis", "jdbc", "odbc", "executable", "executablepool", "input",
        "deltalake", "deltalakecluster", "deltalakes3", "deltalakeazure", "deltalakelocal",
        "iceberg", "icebergs3", "icebergazure", "iceberghdfs", "iceberglocal",
        "icebergcluster", "icebergs3cluster", "hudi", "hudicluster", "paimon", "python",
        "arrowflight", "ytsaurus", "dictionary", "s3queue", "azurequeue", "prometheusquery",
    }
)  # fmt: skip

_TOKEN_RE = re.compile(
    r"""
      (?P<comment>--[^\n]*|\#[^\n]*|/\*.*?(?:\*/|\Z))
    | (?P<string>'(?:[^'\\]|\\.|'')*(?:'|\Z))
    | (?P<heredoc>\$(?P<tag>\w*)\$.*?(?:\$(?P=tag)\$|\Z))
    | (?P<quoted>"(?:[^"\\]|\\.|"")*(?:"|\Z)|`(?:[^`\\]|\\.|``)*(?:`|\Z))
    | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
    | (?P<semicolon>;)
    | (?P<paren>\()
    | (?P<other>\S)
    """,
    re.VERBOSE | re.DOTALL,
)


def check_read_only(sql: str) -> None:
    """Raise ``LedgerReadOnlyError`` unless ``sql`` is one statement that only reads the ledger.

    Example::

        check_read_only("SELECT count() FROM runs")         # passes
        check_read_only("DROP TABLE runs_store")            # LedgerReadOnlyError
    """
    tokens = [
        (kind, text) for kind, text in _tokens(sql) if kind not in ("comment", "string", "heredoc")
    ]
    first = next((text.lower() for kind, text in tokens if kind == "word"), None)
    if first is None:
        raise LedgerReadOnlyError("no statement to run (only comments or blanks)")
    kinds = [kind for kind, _ in tokens]
    if "semicolon" in kinds and any(k != "semicolon" for k in kinds[kinds.index("semicolon") :]):
        raise LedgerReadOnlyError("more than one statement; run one statement at a time")
    if first not in READ_STATEMENTS:
        raise LedgerReadOnlyError(
            f"{first.upper()} is not a read-only statement (allowed: "
            f"{', '.join(sorted(s.upper() for s in READ_STATEMENTS))})"
        )
    for i, (kind, text) in enumerate(tokens):
        name = text.strip('"`').lower()
        if first == "show" and name == "create":
            continue
        if kind == "word" and name in _WRITE_KEYWORDS:
            raise LedgerReadOnlyError(f"the statement uses {text.upper()}, which writes")
        if (
            kind in ("word", "quoted")
            and name in _OUTSIDE_FUNCTIONS
            and i + 1 < len(tokens)
            and tokens[i + 1][0] == "paren"
        ):
            raise LedgerReadOnlyError(
                f"the statement calls {name}(), which reads files, URLs or other servers"
            )


def _tokens(sql: str) -> list[tuple[str, str]]:
    out = []
    for match in _TOKEN_RE.finditer(sql):
        kind = match.lastgroup or "other"
        if kind == "tag":  # the heredoc's inner group
            kind = "heredoc"
        out.append((kind, match.group(0)))
    return out


def read_only_query(
    client: Client, sql: str, parameters: dict[str, Any] | None = None
) -> QueryResult:
    """Check ``sql`` (``check_read_only``) and run it with ClickHouse's ``readonly = 1``.

    Example::

        result = read_only_query(client, "SELECT status, count() FROM runs GROUP BY status")
    """
    check_read_only(sql)
    path = getattr(client, "path", None)
    if type(client).__name__ == "ChdbClient" and path:
        database = client.database
        handle = clickhouse_connect.get_client(
            interface="chdb",
            path=None if path == ":memory:" else path,
            database=database if database and database_exists(client, database) else None,
            settings={"readonly": 1},
        )
        try:
            return query(handle, sql, parameters)
        finally:
            handle.close()
    try:
        return query(client, sql, parameters, settings={"readonly": 1})
    except LedgerQueryError as exc:
        # A user whose profile is already readonly = 1 may not even restate the setting.
        if "Cannot modify 'readonly'" not in str(exc) or not _session_is_read_only(client):
            raise
    return query(client, sql, parameters)


def _session_is_read_only(client: Client) -> bool:
    rows = client.query("SELECT toUInt8(getSetting('readonly'))").result_rows
    return bool(rows and int(rows[0][0]) >= 1)
