"""``connect()``: a clickhouse-connect client for a ``chdb://`` path or an ``http(s)://`` server.

``parse_dsn`` is the one DSN parser (settings validate with it, ``connect`` uses it) and
``redact_dsn`` the one way a DSN is shown: the password is masked whatever it holds, an
unencoded ``@`` or ``/`` included. A DSN in settings is a ``SecretDsn``: ``str()`` and
``repr()`` give the redacted form, ``get_secret_value()`` the real one.

chDB hosts one engine per process, on one path. ``connect`` therefore keeps one client
per engine path and hands it out again; asking for a second path in the same process
fails with ``LedgerConfigError`` instead of chDB's low-level message. An absolute engine
path must have an existing parent directory (a typo is not turned into a directory tree);
a relative one, like the default ``./.data/ledger``, is created under the working directory.
``connect(..., create=False)``, what every command that only reads uses, creates nothing:
a chDB path that holds no engine, or a database that does not exist, is ``no ledger at ...``.

``engine_siblings`` gives a chDB client more handles on its engine, so that independent
reads (a run's timeline) and a flush's inserts run at once: chDB releases the GIL while a
query runs, and one handle runs one query at a time. ``close_client`` closes a client
with them (the engine stops only when its last handle is closed).
"""

from __future__ import annotations

import os
import re
import threading
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote

import clickhouse_connect
from clickhouse_connect.driver.client import Client
from pydantic import SecretStr

from prism.sinks._errors import LedgerConfigError, LedgerConnectError

__all__ = [
    "DsnTarget",
    "SecretDsn",
    "chdb_path",
    "close_client",
    "connect",
    "database_exists",
    "engine_siblings",
    "parse_dsn",
    "redact_dsn",
    "validate_identifier",
]

_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_HTTP_SCHEMES = {"http": False, "https": True, "clickhouse": False, "clickhouses": True}
_SCHEMES = "chdb://, http://, https://, clickhouse:// or clickhouses://"
_MEMORY = ":memory:"

_lock = threading.Lock()
_chdb_clients: dict[str, Client] = {}
# Each chDB client's extra handles (engine_siblings), closed once the client is closed.
_siblings: weakref.WeakKeyDictionary[Client, list[Client]] = weakref.WeakKeyDictionary()


class SecretDsn(SecretStr):
    """A ledger DSN as a secret: shown (``str``, ``repr``, logs) with its password masked."""

    def _display(self) -> str:  # type: ignore[override]
        return redact_dsn(self.get_secret_value())


@dataclass(frozen=True, slots=True)
class DsnTarget:
    """What a DSN points at: a chDB engine path (``":memory:"`` for none) or an HTTP server."""

    kind: str  # "chdb" | "http"
    path: str | None = None  # chdb: absolute engine path or ":memory:"
    host: str | None = None
    port: int | None = None
    secure: bool = False
    username: str | None = None
    password: SecretStr | None = field(default=None, repr=False)
    database: str | None = None  # named in the DSN (http path), if any
    options: dict[str, str] = field(default_factory=dict)  # the DSN's query string


@dataclass(frozen=True, slots=True)
class _Parts:
    scheme: str  # lower case, "" when the DSN has none
    username: str | None  # raw (still percent-encoded)
    password: str | None  # raw
    location: str  # host[:port][/path][?query] for servers, the path for chdb


def _split(dsn: str) -> _Parts:
    """Scheme, credentials and the rest. Credentials end at the *last* ``@``, so an unencoded
    ``@``, ``/``, ``:`` or ``?`` in a password stays in the password."""
    scheme, sep, rest = dsn.partition("://")
    if not sep:
        scheme, rest = "", dsn
    scheme = scheme.lower()
    if scheme == "chdb" or "@" not in rest:
        return _Parts(scheme, None, None, rest)
    userinfo, _, location = rest.rpartition("@")
    user, colon, password = userinfo.partition(":")
    return _Parts(scheme, user, password if colon else None, location)


def redact_dsn(dsn: str | SecretStr) -> str:
    """The DSN with its password replaced by ``***`` (safe for messages and logs).

    Example::

        redact_dsn("https://prism:p@ss/word@ch.example:8443/prism")
        # "https://prism:***@ch.example:8443/prism"
    """
    text = dsn.get_secret_value() if isinstance(dsn, SecretStr) else str(dsn)
    parts = _split(text)
    if parts.password is None and parts.username is None:
        return text
    prefix = f"{text.partition('://')[0]}://" if "://" in text else ""
    shown = parts.username or ""
    if parts.password is not None:
        shown += ":***"
    return f"{prefix}{shown}@{parts.location}"


def validate_identifier(name: str, what: str = "database") -> str:
    """Return ``name`` if it is a plain ClickHouse identifier, else raise ``LedgerConfigError``."""
    if not isinstance(name, str) or not _IDENT_RE.match(name):
        raise LedgerConfigError(
            f"{what} name {name!r} is not a plain identifier ([A-Za-z_][A-Za-z0-9_]*, "
            "at most 64 chars); pick a name like 'prism'"
        )
    return name


def parse_dsn(dsn: str | SecretStr) -> DsnTarget:
    """Parse a ledger DSN; relative chDB paths resolve against the current directory.

    Every error names the DSN with its password masked.

    Example::

        parse_dsn("chdb://./.data/ledger").path      # "/home/me/project/.data/ledger"
        parse_dsn("https://u:pw@ch.example:8443/prism").database   # "prism"
    """
    text = dsn.get_secret_value() if isinstance(dsn, SecretStr) else dsn
    if not isinstance(text, str) or not text.strip():
        raise LedgerConfigError(
            f"ClickHouse DSN {text!r} is empty; use chdb://<path> for the embedded engine or "
            "http(s)://user:password@host:port/database for a server"
        )
    shown = redact_dsn(text)
    parts = _split(text)
    if not parts.scheme:
        raise LedgerConfigError(
            f"ClickHouse DSN {shown!r} has no scheme; use chdb://<path> for the embedded "
            "engine or http(s)://user:password@host:port/database for a server"
        )
    if parts.scheme == "chdb":
        location = unquote(parts.location.partition("?")[0])
        if location in ("", "memory", _MEMORY):
            return DsnTarget(kind="chdb", path=_MEMORY)
        return DsnTarget(kind="chdb", path=os.path.realpath(Path(location).expanduser()))
    if parts.scheme not in _HTTP_SCHEMES:
        raise LedgerConfigError(
            f"ClickHouse DSN {shown!r} has the unsupported scheme {parts.scheme!r}; use {_SCHEMES}"
        )
    address, _, query = parts.location.partition("?")
    hostport, _, path = address.partition("/")
    host, port = _host_port(hostport, shown)
    database = unquote(path.split("/")[0]) or None
    if database is not None:
        try:
            validate_identifier(database)
        except LedgerConfigError:
            raise LedgerConfigError(
                f"ClickHouse DSN {shown!r} names the database {database!r}, which is not a "
                "plain identifier ([A-Za-z_][A-Za-z0-9_]*); if the password holds '@', '/' or "
                "'?', percent-encode it (%40, %2F, %3F)"
            ) from None
    options = {k: v[0] for k, v in parse_qs(query).items()}
    secure = _HTTP_SCHEMES[parts.scheme] or options.get("secure", "").lower() == "true"
    return DsnTarget(
        kind="http",
        host=host,
        port=port or (8443 if secure else 8123),
        secure=secure,
        username=unquote(parts.username) if parts.username else None,
        password=SecretStr(unquote(parts.password)) if parts.password else None,
        database=database,
        options=options,
    )


def _host_port(hostport: str, shown: str) -> tuple[str, int | None]:
    if hostport.startswith("["):  # [IPv6]:port
        host, _, tail = hostport[1:].partition("]")
        port_text = tail[1:] if tail.startswith(":") else ""
    else:
        host, _, port_text = hostport.partition(":")
    if not host:
        raise LedgerConfigError(
            f"ClickHouse DSN {shown!r} names no host; use http(s)://user:password@host:port/database"
        )
    if not port_text:
        return host, None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise LedgerConfigError(
            f"ClickHouse DSN {shown!r} has a bad port; use host:port with a port "
            "in 1..65535 (8123 for http, 8443 for https)"
        )
    return host, int(port_text)


def connect(dsn: str | SecretStr, database: str | None = None, *, create: bool = True) -> Client:
    """A clickhouse-connect client for ``dsn``; its default database is ``database`` if it exists.

    chDB clients are cached per engine path (one engine per process), so calling this
    twice with the same path returns the same client. Every ``sinks`` function qualifies
    table names with the database, so the client's default only matters for ad hoc SQL.

    ``create=False`` is for readers: nothing is created, and a chDB path without an engine
    or a ``database`` (else the DSN's) that does not exist raises ``LedgerConfigError``
    ``no ledger at PATH (...)`` instead of an empty engine that answers "Unknown table".

    Example::

        client = connect("chdb://./.data/ledger", "prism")
        migrate(client, "prism")
        client.query("SELECT count() FROM runs").result_rows
    """
    if database is not None:
        validate_identifier(database)
    target = parse_dsn(dsn)
    text = dsn.get_secret_value() if isinstance(dsn, SecretStr) else dsn
    if not create and target.kind == "chdb":
        _require_engine(target.path or _MEMORY)
    client = (
        _chdb_client(text, target, create=create)
        if target.kind == "chdb"
        else _http_client(text, target)
    )
    wanted = database or target.database
    exists = bool(wanted) and database_exists(client, str(wanted))
    if not create and wanted and not exists:
        where = target.path if target.kind == "chdb" else redact_dsn(text)
        raise LedgerConfigError(
            f"no ledger at {where} (it has no database {wanted!r}; run `make demo`, or pass "
            "--clickhouse or --database)"
        )
    if wanted and client.database != wanted and exists:
        client.database = wanted
    return client


def _require_engine(path: str) -> None:
    """A reader's chDB path must hold an engine already (its ``metadata`` directory)."""
    if path == _MEMORY or not (Path(path) / "metadata").is_dir():
        raise LedgerConfigError(f"no ledger at {path} (run `make demo` or pass --clickhouse)")


def database_exists(client: Client, database: str) -> bool:
    """Whether ``database`` exists on the server behind ``client``."""
    result = client.query(
        "SELECT count() FROM system.databases WHERE name = {db:String}",
        parameters={"db": database},
    )
    return bool(result.result_rows[0][0])


def chdb_path(client: Client) -> str | None:
    """The engine path of a client on the embedded chDB engine (``":memory:"`` for none);
    ``None`` for a ClickHouse server's client."""
    path = getattr(client, "path", None)
    return path if type(client).__name__ == "ChdbClient" and path else None


def chdb_handle(path: str, **kwargs: Any) -> Client:
    """A client on the chDB engine at ``path`` (``":memory:"``: the process's in-memory
    engine); ``kwargs`` go to ``clickhouse_connect.get_client``. A process hosts one
    engine: a handle on another path than the one open fails (``connect`` says why)."""
    return clickhouse_connect.get_client(
        interface="chdb", path=None if path == _MEMORY else path, **kwargs
    )


def engine_siblings(client: Client, count: int) -> list[Client]:
    """``count`` more clients on ``client``'s chDB engine; ``[]`` for a server's client.

    They are opened on first use (about 17 ms each) and kept for ``client``'s life: they
    are closed once ``client`` is found closed (``connect`` looks before it opens an
    engine) or is collected, so they never hold an engine that the process has let go.
    Each has its own handle, so queries on them run at the same time as ``client``'s.

    Example::

        others = engine_siblings(client, 3)  # [] on a server: run the reads one by one
    """
    path = chdb_path(client)
    if path is None or count <= 0:
        return []
    with _lock:
        held = _siblings.get(client)
        if held is None:
            held = _siblings[client] = []
            weakref.finalize(client, _close_all, held)
        while len(held) < count:
            held.append(chdb_handle(path))
        return held[:count]


def close_client(client: Client) -> None:
    """Close ``client`` and the handles ``engine_siblings`` opened beside it (a ledger
    writer's parallel inserts, a timeline's lookups). A chDB engine runs until its last
    handle is closed, merging parts into its folder meanwhile: close the client this way
    before removing that folder in the same process.

    Example::

        close_client(client)
        shutil.rmtree(path)
    """
    with _lock:
        held = _siblings.pop(client, None)
    _close_all(held or [])
    client.close()


def _close_all(clients: list[Client]) -> None:
    while clients:
        clients.pop().close()


def _close_orphaned_siblings() -> None:
    """Close the extra handles of every chDB client that was closed (the caller holds ``_lock``)."""
    for owner, held in list(_siblings.items()):
        if not owner.ping():
            _close_all(held)
            del _siblings[owner]


def chdb_options(dsn: str) -> dict[str, str]:
    """The engine options in a ``chdb://`` DSN's query string."""
    return {k: v[0] for k, v in parse_qs(dsn.partition("?")[2]).items()}


def _chdb_client(dsn: str, target: DsnTarget, *, create: bool = True) -> Client:
    path = target.path or _MEMORY
    with _lock:
        _close_orphaned_siblings()
        cached = _chdb_clients.get(path)
        if cached is not None and cached.ping():
            return cached
        _chdb_clients.pop(path, None)
        if path != _MEMORY and create:  # a bad path is named first, whatever else is held
            _check_engine_dir(Path(path))
            _prepare_engine_dir(Path(path))
        others = [p for p, c in _chdb_clients.items() if c.ping()]
        if others:
            raise LedgerConfigError(_one_engine_message(others[0], path))
        try:
            client = chdb_handle(path, chdb_options=chdb_options(dsn))
        except Exception as exc:
            held = re.search(r"initialized with path '([^']*)'", str(exc))
            if held:
                raise LedgerConfigError(_one_engine_message(held.group(1), path)) from None
            reason = engine_error(exc)
            hint = (
                "; another process (a worker?) holds this path: stop it, or use a ClickHouse "
                "server to share the ledger"
                if "lock" in reason.lower()
                else ""
            )
            raise LedgerConnectError(
                f"could not open the chDB engine at {path!r}: {reason}{hint}"
            ) from None
        _chdb_clients[path] = client
        return client


def _check_engine_dir(path: Path) -> None:
    """A usable engine directory: not a file; its parent exists unless under the working dir."""
    if path.exists() and not path.is_dir():
        raise LedgerConfigError(f"chDB path {str(path)!r} is a file; name a directory")
    parent = path.parent
    if not parent.is_dir() and not path.is_relative_to(Path.cwd().resolve()):
        raise LedgerConfigError(
            f"the parent directory {str(parent)!r} of the chDB path {str(path)!r} does not "
            "exist; create it first (mkdir -p) or fix the DSN"
        )


def _prepare_engine_dir(path: Path) -> None:
    """Create the engine directory (checked by ``_check_engine_dir``) and probe it."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".prism-write-check"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise LedgerConfigError(
            f"cannot use {str(path)!r} as a chDB engine directory: {exc.strerror or exc}; "
            "pick a writable directory"
        ) from None


def engine_error(exc: BaseException) -> str:
    """chDB's message without its C++ stack trace, on one line."""
    text = str(exc).split("Stack trace", 1)[0]
    text = " ".join(text.split()).rstrip(" ,.:;")
    return text[:500] or type(exc).__name__


def _one_engine_message(held: str, wanted: str) -> str:
    return (
        f"chDB runs one engine per process: this process already uses the engine at "
        f"{held!r}, so it cannot open {wanted!r}. Use the same chdb:// path everywhere in "
        "this process (PRISM_CLICKHOUSE_DSN), or read the other ledger from a separate "
        "process (e.g. `prism-pipeline query`)."
    )


def _http_client(dsn: str, target: DsnTarget) -> Client:
    # The database is applied by connect() once it is known to exist (migrate creates it).
    # Credentials go as arguments, never inside a URL the driver might print.
    kwargs: dict[str, Any] = dict(target.options)
    kwargs.pop("secure", None)
    password = target.password.get_secret_value() if target.password else ""
    try:
        return clickhouse_connect.get_client(
            host=target.host,
            port=target.port,
            username=target.username or "default",
            password=password,
            secure=target.secure,
            **kwargs,
        )
    except Exception as exc:
        message = str(exc).replace(password, "***") if password else str(exc)
        raise LedgerConnectError(
            f"could not reach ClickHouse at {target.host}:{target.port} "
            f"(DSN {redact_dsn(dsn)!r}): {message}; check the host, port, credentials and that "
            "the server is running"
        ) from None
