"""``connect()``: a clickhouse-connect client for a ``chdb://`` path or an ``http(s)://`` server.

chDB hosts one engine per process, on one path. ``connect`` therefore keeps one client
per engine path and hands it out again; asking for a second path in the same process
fails with ``LedgerConfigError`` instead of chDB's low-level message.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse, urlunparse

import clickhouse_connect
from clickhouse_connect.driver.client import Client

from prism.sinks._errors import LedgerConfigError, LedgerConnectError, redact_dsn

__all__ = ["DsnTarget", "connect", "database_exists", "parse_dsn", "validate_identifier"]

_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_HTTP_SCHEMES = {"http": False, "https": True, "clickhouse": False, "clickhouses": True}
_MEMORY = ":memory:"

_lock = threading.Lock()
_chdb_clients: dict[str, Client] = {}


@dataclass(frozen=True, slots=True)
class DsnTarget:
    """What a DSN points at: a chDB engine path (``":memory:"`` for none) or an HTTP server."""

    kind: str  # "chdb" | "http"
    path: str | None = None  # chdb: absolute engine path or ":memory:"
    host: str | None = None
    port: int | None = None
    secure: bool = False
    username: str | None = None
    password: str | None = None
    database: str | None = None  # named in the DSN (http path), if any


def validate_identifier(name: str, what: str = "database") -> str:
    """Return ``name`` if it is a plain ClickHouse identifier, else raise ``LedgerConfigError``."""
    if not isinstance(name, str) or not _IDENT_RE.match(name):
        raise LedgerConfigError(
            f"{what} name {name!r} is not a plain identifier ([A-Za-z_][A-Za-z0-9_]*, "
            "at most 64 chars); pick a name like 'prism'"
        )
    return name


def parse_dsn(dsn: str) -> DsnTarget:
    """Parse a ledger DSN; relative chDB paths resolve against the current directory.

    Example::

        parse_dsn("chdb://./.data/ledger").path      # "/home/me/project/.data/ledger"
        parse_dsn("https://u:pw@ch.example:8443/prism").database   # "prism"
    """
    if not isinstance(dsn, str) or "://" not in dsn:
        raise LedgerConfigError(
            f"ClickHouse DSN {dsn!r} has no scheme; use chdb://<path> for the embedded "
            "engine or http(s)://user:password@host:port/database for a server"
        )
    scheme, _, rest = dsn.partition("://")
    scheme = scheme.lower()
    if scheme == "chdb":
        location = unquote(rest.partition("?")[0])
        if location in ("", "memory", _MEMORY):
            return DsnTarget(kind="chdb", path=_MEMORY)
        return DsnTarget(kind="chdb", path=os.path.realpath(Path(location).expanduser()))
    if scheme not in _HTTP_SCHEMES:
        raise LedgerConfigError(
            f"ClickHouse DSN {redact_dsn(dsn)!r} has the unsupported scheme {scheme!r}; "
            "use chdb://, http://, https:// or clickhouse://"
        )
    parsed = urlparse(dsn)
    try:
        port = parsed.port
    except ValueError:
        raise LedgerConfigError(
            f"ClickHouse DSN {redact_dsn(dsn)!r} has a bad port; use host:port with a port "
            "in 1..65535 (8123 for http, 8443 for https)"
        ) from None
    if not parsed.hostname:
        raise LedgerConfigError(
            f"ClickHouse DSN {redact_dsn(dsn)!r} names no host; "
            "use http(s)://user:password@host:port/database"
        )
    database = unquote(parsed.path.lstrip("/").split("/")[0]) or None
    if database is not None:
        validate_identifier(database)
    secure = _HTTP_SCHEMES[scheme] or "secure=true" in parsed.query.lower()
    return DsnTarget(
        kind="http",
        host=parsed.hostname,
        port=port or (8443 if secure else 8123),
        secure=secure,
        username=unquote(parsed.username) if parsed.username else None,
        password=unquote(parsed.password) if parsed.password else None,
        database=database,
    )


def connect(dsn: str, database: str | None = None) -> Client:
    """A clickhouse-connect client for ``dsn``; its default database is ``database`` if it exists.

    chDB clients are cached per engine path (one engine per process), so calling this
    twice with the same path returns the same client. Every ``sinks`` function qualifies
    table names with the database, so the client's default only matters for ad hoc SQL.

    Example::

        client = connect("chdb://./.data/ledger", "prism")
        migrate(client, "prism")
        client.query("SELECT count() FROM runs").result_rows
    """
    if database is not None:
        validate_identifier(database)
    target = parse_dsn(dsn)
    client = _chdb_client(dsn, target) if target.kind == "chdb" else _http_client(dsn, target)
    wanted = database or target.database
    if wanted and client.database != wanted and database_exists(client, wanted):
        client.database = wanted
    return client


def database_exists(client: Client, database: str) -> bool:
    """Whether ``database`` exists on the server behind ``client``."""
    result = client.query(
        "SELECT count() FROM system.databases WHERE name = {db:String}",
        parameters={"db": database},
    )
    return bool(result.result_rows[0][0])


def _chdb_client(dsn: str, target: DsnTarget) -> Client:
    path = target.path or _MEMORY
    options = {k: v[0] for k, v in parse_qs(dsn.partition("?")[2]).items()}
    with _lock:
        cached = _chdb_clients.get(path)
        if cached is not None and cached.ping():
            return cached
        _chdb_clients.pop(path, None)
        others = [p for p, c in _chdb_clients.items() if c.ping()]
        if others:
            raise LedgerConfigError(_one_engine_message(others[0], path))
        if path != _MEMORY:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        try:
            client = clickhouse_connect.get_client(
                interface="chdb", path=None if path == _MEMORY else path, chdb_options=options
            )
        except Exception as exc:
            held = re.search(r"initialized with path '([^']*)'", str(exc))
            if held:
                raise LedgerConfigError(_one_engine_message(held.group(1), path)) from None
            raise LedgerConnectError(
                f"could not open the chDB engine at {path!r} (from DSN {dsn!r}): {exc}; "
                "one process at a time may open a chDB path: if a worker or another command "
                "holds it, stop that process first (or use a ClickHouse server)"
            ) from exc
        _chdb_clients[path] = client
        return client


def _one_engine_message(held: str, wanted: str) -> str:
    return (
        f"chDB runs one engine per process: this process already uses the engine at "
        f"{held!r}, so it cannot open {wanted!r}. Use the same chdb:// path everywhere in "
        "this process (PRISM_CLICKHOUSE_DSN), or read the other ledger from a separate "
        "process (e.g. `prism-pipeline query`)."
    )


def _http_client(dsn: str, target: DsnTarget) -> Client:
    # The database is applied by connect() once it is known to exist (migrate creates it).
    parsed = urlparse(dsn)
    without_db = urlunparse(parsed._replace(scheme="https" if target.secure else "http", path=""))
    try:
        return clickhouse_connect.get_client(dsn=without_db, secure=target.secure)
    except Exception as exc:
        raise LedgerConnectError(
            f"could not reach ClickHouse at {target.host}:{target.port} "
            f"(DSN {redact_dsn(dsn)!r}): {exc}; check the host, port, credentials and that "
            "the server is running"
        ) from exc
