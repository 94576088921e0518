"""Read-only ad hoc SQL: ClickHouse's own parser decides what a statement is, then ``readonly``.

Two layers, so neither alone has to be perfect:

1. ``check_read_only`` is an allow-list, not a list of words to avoid. ClickHouse parses the
   statement (``formatQuerySingleLine``, with the text passed as a value, never run): a
   syntax error is a ``QuerySyntaxError`` in ClickHouse's words, two statements are
   refused. ``EXPLAIN AST`` of that one statement gives its tree (parsed, not run), and
   every node of it is walked, so a table function or another database's table hidden in
   a subquery, a CTE, a JOIN or an ``IN`` is found. What passes is one ``SELECT``/``WITH``,
   ``SHOW TABLES``, ``SHOW CREATE TABLE|VIEW``, ``DESCRIBE``, ``EXISTS`` or ``EXPLAIN`` of
   a ``SELECT``, whose every table is one of the ledger database's own tables and views
   (listed from ``system.tables``, not from a copy), with no table function, no function
   that reads files or other tables (``file()``, ``joinGet()``, ``dictGet()``...), no
   ``SETTINGS``, no ``INTO OUTFILE`` and no ``FORMAT``. Anything else is a
   ``LedgerReadOnlyError`` that names what was refused and why.
2. ``read_only_query`` runs the statement as ClickHouse formatted it (what was checked is
   what runs) with ``readonly = 1``, which ClickHouse enforces. On chDB it runs on a handle
   of its own, since chDB keeps a failed query's ``readonly`` on its handle.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from clickhouse_connect.driver.client import Client

from prism.sinks._client import (
    chdb_handle,
    chdb_path,
    database_exists,
    engine_error,
    validate_identifier,
)
from prism.sinks._errors import LedgerQueryError, LedgerReadOnlyError
from prism.sinks._queries import QueryResult, query

__all__ = [
    "ALLOWED_STATEMENTS",
    "QuerySyntaxError",
    "check_read_only",
    "ledger_tables",
    "read_only_query",
]

ALLOWED_STATEMENTS = (
    "SELECT, WITH, SHOW TABLES, SHOW CREATE TABLE, DESCRIBE, EXISTS or EXPLAIN SELECT"
)

# The formatted statement's first words -> the AST node ClickHouse must have made of it.
_TOP_NODES = {
    "SELECT": ("SelectWithUnionQuery",),
    "WITH": ("SelectWithUnionQuery",),
    "(": ("SelectWithUnionQuery",),
    "SHOW TABLES": ("ShowTables",),
    "SHOW FULL TABLES": ("ShowTables",),
    "SHOW CREATE TABLE": ("ShowCreateTableQuery",),
    "SHOW CREATE VIEW": ("ShowCreateViewQuery",),
    "DESCRIBE": ("DescribeQuery",),
    "EXISTS": ("ExistsTableQuery", "ExistsViewQuery"),
    "EXPLAIN": ("Explain",),
}
_HEADS = sorted(_TOP_NODES, key=len, reverse=True)  # SHOW CREATE TABLE before SHOW TABLES
# Scalar functions that read files or name a table or dictionary in a string argument.
_OUTSIDE_FUNCTIONS = frozenset({"file", "joinget", "joingetornull", "hascolumnintable"})
_IN_FUNCTIONS = frozenset(
    {"in", "notin", "globalin", "globalnotin", "nullin", "notnullin", "globalnullin",
     "globalnotnullin"}
)  # fmt: skip
_SUFFIX_RE = re.compile(r"(?: \(alias .*?\))?(?: \(children \d+\))?$")
_NO_SETTINGS = "SETTINGS are not allowed: `query` runs with readonly=1 and the server's settings"
_LEAD_RE = re.compile(r"^(?:\s+|--[^\n]*|#[^\n]*|/\*.*?\*/|\()*", re.S)
_SCOPE_RE = re.compile(r":? In scope SELECT formatQuerySingleLine\(.*$", re.S)


class QuerySyntaxError(LedgerReadOnlyError):
    """The statement does not parse; the message is ClickHouse's syntax error."""


@dataclass(slots=True)
class _Node:
    kind: str
    name: str
    children: list[_Node] = field(default_factory=list)


def check_read_only(
    client: Client, sql: str, database: str, parameters: dict[str, Any] | None = None
) -> str:
    """The statement as ClickHouse formats it, if it only reads the ledger ``database``.

    Raises ``QuerySyntaxError`` when ClickHouse cannot parse ``sql`` and
    ``LedgerReadOnlyError`` (naming what and why) for anything the allow-list above does not
    hold. Nothing of ``sql`` runs: it is parsed and explained, never executed.

    Example::

        check_read_only(client, "select count() from runs", "prism")  # 'SELECT count() FROM runs'
        check_read_only(client, "SELECT * FROM url('http://x', CSV)", "prism")  # refused
    """
    validate_identifier(database)
    statement = _format(client, sql)
    if "\n" in statement or "\r" in statement:  # one line per AST node below
        raise LedgerReadOnlyError("a name or value holds a line break; write it without one")
    words = statement.split(" ")
    head = next((h for h in _HEADS if statement == h or statement.startswith(h + " ")
                 or (h == "(" and statement.startswith(h))), None)  # fmt: skip
    if head is None:
        raise LedgerReadOnlyError(
            f"{_statement_name(words)} is not allowed: `query` runs one {ALLOWED_STATEMENTS} "
            "(an operator who means to change the ledger adds --allow-writes)"
        )
    if head in ("SELECT", "WITH", "(") and _first_word(sql) not in ("SELECT", "WITH", "FROM"):
        # ClickHouse may read a bare expression as a SELECT (implicit_select): "SELEC x"
        # becomes "SELECT SELEC AS x". A typo of a keyword is a parse error, said as one.
        raise QuerySyntaxError(
            f"parse error: {_first_word(sql) or sql.strip()[:20]!r} is not a statement keyword "
            f"(ClickHouse would read it as {statement[:80]!r}); start with SELECT or WITH"
        )
    root = _tree(client, statement, parameters)
    if root.kind not in _TOP_NODES[head]:
        raise LedgerReadOnlyError(
            f"{_statement_name(words)} ({root.kind}) is not allowed: `query` runs one "
            f"{ALLOWED_STATEMENTS}"
        )
    _Walk(database, ledger_tables(client, database)).statement(root, head)
    return statement


def ledger_tables(client: Client, database: str) -> frozenset[str]:
    """The tables and views of the ledger database, as the server lists them."""
    rows = client.query(
        "SELECT name FROM system.tables WHERE database = {db:String}",
        parameters={"db": database},
    ).result_rows
    return frozenset(str(name) for (name,) in rows)


def _format(client: Client, sql: str) -> str:
    """ClickHouse's canonical one-line form of ``sql`` (its parser; the text is a value)."""
    try:
        rows = client.query(
            "SELECT formatQuerySingleLine({sql:String})", parameters={"sql": sql}
        ).result_rows
    except Exception as exc:
        text = engine_error(exc)
        if "SYNTAX_ERROR" not in text and "Syntax error" not in text:
            raise LedgerQueryError(f"could not parse the statement: {text}") from exc
        if "Multi-statements are not allowed" in text:
            raise LedgerReadOnlyError(
                "more than one statement; run one statement at a time"
            ) from None
        if "Empty query" in text:
            raise LedgerReadOnlyError("no statement to run (only comments or blanks)") from None
        raise QuerySyntaxError(f"parse error: {_syntax_message(text)}") from None
    return str(rows[0][0]).strip()


def _syntax_message(text: str) -> str:
    """ClickHouse's syntax error, without its code, our wrapper and most of 'Expected one of'."""
    text = _SCOPE_RE.sub("", text.partition("DB::Exception: ")[2] or text).rstrip(" .")
    text = text.removesuffix("(SYNTAX_ERROR)").rstrip(" .:")
    before, marker, expected = text.partition("Expected one of: ")
    if marker:
        items = expected.split(", ")
        text = before + marker + ", ".join(items[:8]) + (", ..." if len(items) > 8 else "")
    return text


def _first_word(sql: str) -> str:
    """The statement's first word, past comments, blanks and opening parentheses."""
    rest = _LEAD_RE.sub("", sql)
    match = re.match(r"[A-Za-z_]+", rest)
    return match[0].upper() if match else ""


def _statement_name(words: list[str]) -> str:
    """``INSERT``, ``SHOW PROCESSLIST``, ``SHOW CREATE USER``: the statement's keywords."""
    name = [words[0]]
    more = {"SHOW": 2, "EXISTS": 1, "EXPLAIN": 1, "SYSTEM": 1, "KILL": 1}.get(words[0], 0)
    if more:
        for word in words[1 : 1 + more]:
            if not word.isalpha() or not word.isupper():
                break
            name.append(word)
    return " ".join(name)


def _tree(client: Client, statement: str, parameters: dict[str, Any] | None) -> _Node:
    """``EXPLAIN AST`` of one formatted statement, as nodes (indentation is depth)."""
    try:
        result = client.query(f"EXPLAIN AST {statement}", parameters=parameters)
        lines = [str(row[0]) for row in result.result_rows]
    except Exception as exc:
        text = engine_error(exc)
        if "Cannot modify" in text and "readonly" in text:  # its SETTINGS, on a readonly handle
            raise LedgerReadOnlyError(_NO_SETTINGS) from None
        raise LedgerQueryError(f"could not parse the statement: {text}") from exc
    stack: list[tuple[int, _Node]] = []
    root: _Node | None = None
    for line in lines:
        depth = len(line) - len(line.lstrip(" "))
        text = _SUFFIX_RE.sub("", line.strip())
        kind, _, name = text.partition(" ")
        node = _Node(kind, name.strip())
        while stack and stack[-1][0] >= depth:
            stack.pop()
        if stack:
            stack[-1][1].children.append(node)
        elif root is None:
            root = node
        else:
            raise LedgerReadOnlyError("more than one statement; run one statement at a time")
        stack.append((depth, node))
    if root is None:
        raise LedgerReadOnlyError("no statement to run (only comments or blanks)")
    return root


class _Walk:
    """Refuse, node by node, whatever reads beyond the ledger's own tables and views."""

    def __init__(self, database: str, tables: frozenset[str]) -> None:
        self.database = database
        self.tables = tables

    def statement(self, root: _Node, head: str) -> None:
        names = self._output_clauses(root)
        if root.kind == "Explain":
            inner = [c for c in root.children if c.kind != "Identifier"]
            if len(inner) != 1 or inner[0].kind != "SelectWithUnionQuery":
                kinds = ", ".join(c.kind for c in inner) or "nothing"
                raise LedgerReadOnlyError(
                    f"EXPLAIN of {kinds} is not allowed: `query` explains a SELECT only"
                )
            self._output_clauses(inner[0])
        if root.kind == "ShowTables":
            if names and names[0] != self.database:
                self._outside(f"SHOW TABLES FROM {names[0]}")
            return
        if root.kind in ("ShowCreateTableQuery", "ShowCreateViewQuery"):
            self.table(".".join(names))
            return
        if root.kind in ("ExistsTableQuery", "ExistsViewQuery"):
            if len(names) == 2 and names[0] != self.database:
                self._outside(".".join(names))
            return
        for child in root.children:
            self.walk(child, root)

    def _output_clauses(self, root: _Node) -> list[str]:
        """Check INTO OUTFILE / FORMAT / SETTINGS of the statement; its other bare names."""
        names = [c.name for c in root.children if c.kind == "Identifier"]
        for child in root.children:
            if child.kind == "Set":
                self.walk(child, root)
            if child.kind == "Literal":
                raise LedgerReadOnlyError(
                    "INTO OUTFILE is not allowed: `query` prints its rows (--format, and a "
                    "shell redirect to keep them)"
                )
        # The last bare name of a statement is its output format (the driver's Native).
        if names:
            fmt = names.pop()
            if fmt != "Native":
                raise LedgerReadOnlyError(f"FORMAT {fmt} is not allowed: use --format")
        return names

    def walk(self, node: _Node, parent: _Node) -> None:
        if node.kind == "Set":
            raise LedgerReadOnlyError(_NO_SETTINGS)
        if node.kind == "QueryParameter":  # the server fills them before EXPLAIN; if not:
            raise LedgerReadOnlyError(f"the query parameter {node.name} was not filled")
        if node.kind == "TableIdentifier":
            self.table(node.name)
        elif node.kind == "Function":
            name = node.name.split(" ")[0]
            lower = name.lower()
            if parent.kind == "TableExpression":
                raise LedgerReadOnlyError(
                    f"table function {name}() is not allowed: `query` reads only the tables "
                    f"and views of the ledger database {self.database!r}"
                )
            if lower in _OUTSIDE_FUNCTIONS or lower.startswith("dict"):
                raise LedgerReadOnlyError(
                    f"function {name}() is not allowed: it reads files, dictionaries or tables "
                    "outside the ledger"
                )
            if lower in _IN_FUNCTIONS and node.children:
                args = node.children[0].children
                if len(args) == 2 and args[1].kind == "Identifier":
                    self.table(args[1].name)  # x IN db.table
        for child in node.children:
            self.walk(child, node)

    def table(self, name: str) -> None:
        """A table named in the statement: unqualified (the ledger's, or a CTE) or ours."""
        if not name or "{" in name:
            raise LedgerReadOnlyError(f"the table name {name!r} could not be checked")
        database, dot, table = name.partition(".")
        if not dot:
            return  # resolved in the ledger database, or a CTE or alias of the statement
        if database != self.database:
            self._outside(name)
        if table not in self.tables:
            raise LedgerReadOnlyError(
                f"{name} is not one of the ledger's tables and views (SHOW TABLES lists them)"
            )

    def _outside(self, what: str) -> None:
        raise LedgerReadOnlyError(
            f"{what} is not allowed: `query` reads only the tables and views of the ledger "
            f"database {self.database!r}"
        )


def read_only_query(
    client: Client,
    sql: str,
    parameters: dict[str, Any] | None = None,
    *,
    database: str | None = None,
) -> QueryResult:
    """Check ``sql`` (``check_read_only``) and run it with ClickHouse's ``readonly = 1``.

    ``database`` is the ledger database (default: the client's); unqualified names resolve
    in it.

    Example::

        result = read_only_query(client, "SELECT status, count() FROM runs GROUP BY status")
    """
    database = database or client.database
    if not database:
        raise LedgerQueryError("no ledger database to query; pass database=")
    path = chdb_path(client)
    if path:
        handle = chdb_handle(
            path,
            database=database if database_exists(client, database) else None,
            settings={"readonly": 1},
        )
        try:
            statement = check_read_only(handle, sql, database, parameters)
            return query(handle, statement, parameters)
        finally:
            handle.close()
    if client.database != database:
        raise LedgerQueryError(
            f"the client's database is {client.database!r}, not the ledger's {database!r}; "
            "connect with that database"
        )
    statement = check_read_only(client, sql, database, parameters)
    try:
        return query(client, statement, parameters, settings={"readonly": 1})
    except LedgerQueryError as exc:
        # A user whose profile is already readonly = 1 may not even restate the setting.
        if "Cannot modify 'readonly'" not in str(exc) or not _session_is_read_only(client):
            raise
    return query(client, statement, parameters)


def _session_is_read_only(client: Client) -> bool:
    rows = client.query("SELECT toUInt8(getSetting('readonly'))").result_rows
    return bool(rows and int(rows[0][0]) >= 1)
