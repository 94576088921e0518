"""Errors of the ClickHouse ledger, and which driver errors are worth retrying.

Hierarchy::

    LedgerError (RuntimeError)              base of every error raised by ``sinks``
    ├── LedgerConfigError (+ ValueError)    bad DSN, database name, cluster, or engine path
    │   └── PriceBookError                  a price file with mistakes (file, line, value named)
    ├── LedgerConnectError                  the ClickHouse server or chDB engine is unreachable
    ├── MigrationError                      a migration failed or an applied one was changed
    ├── LedgerWriteError                    a flush failed for good; rows stay in the writer
    └── LedgerQueryError                    a query (billing, timeline, ad hoc) failed
        └── LedgerReadOnlyError             a read-only query was refused (it could write)
"""

from __future__ import annotations

from clickhouse_connect.driver.exceptions import DatabaseError, OperationalError

__all__ = [
    "TRANSIENT_CODES",
    "LedgerConfigError",
    "LedgerConnectError",
    "LedgerError",
    "LedgerQueryError",
    "LedgerReadOnlyError",
    "LedgerWriteError",
    "MigrationError",
    "PriceBookError",
    "is_transient",
]


class LedgerError(RuntimeError):
    """Base of every error raised by ``sinks``."""


class LedgerConfigError(LedgerError, ValueError):
    """A DSN, database name, cluster name or engine path the ledger cannot use."""


class PriceBookError(LedgerConfigError):
    """A price file that cannot be loaded: each mistake names the file, line, field and value."""


class LedgerConnectError(LedgerError):
    """The ClickHouse server (or the embedded chDB engine) could not be reached."""


class MigrationError(LedgerError):
    """A migration could not be applied, or an applied migration's file has changed."""


class LedgerWriteError(LedgerError):
    """A flush failed after its retries; the rows stay in the writer and offsets must not advance.

    ``table`` is the storage table whose insert failed, ``rows`` the rows still pending in
    the writer, ``attempts`` how many inserts were tried, ``transient`` whether the last
    error looked transient (a later ``flush()`` may succeed) or permanent (bad data or
    schema: retrying the same rows will fail the same way).
    """

    def __init__(
        self, message: str, *, table: str, rows: int, attempts: int, transient: bool
    ) -> None:
        super().__init__(message)
        self.table = table
        self.rows = rows
        self.attempts = attempts
        self.transient = transient


class LedgerQueryError(LedgerError):
    """A query against the ledger failed; the message carries ClickHouse's reason."""


class LedgerReadOnlyError(LedgerQueryError):
    """A statement was refused because it could change the ledger or read outside it."""


# ClickHouse error codes worth retrying: the same insert can succeed a moment later.
TRANSIENT_CODES: frozenset[int] = frozenset(
    {
        3,  # UNEXPECTED_END_OF_FILE
        32,  # ATTEMPT_TO_READ_AFTER_EOF
        159,  # TIMEOUT_EXCEEDED
        164,  # READONLY
        202,  # TOO_MANY_SIMULTANEOUS_QUERIES
        209,  # SOCKET_TIMEOUT
        210,  # NETWORK_ERROR
        225,  # NO_ZOOKEEPER
        236,  # ABORTED
        241,  # MEMORY_LIMIT_EXCEEDED
        242,  # TABLE_IS_READ_ONLY
        252,  # TOO_MANY_PARTS
        285,  # TOO_FEW_LIVE_REPLICAS
        286,  # UNSATISFIED_QUORUM_FOR_PREVIOUS_WRITE
        319,  # UNKNOWN_STATUS_OF_INSERT
        394,  # QUERY_WAS_CANCELLED
        425,  # SYSTEM_ERROR
        999,  # KEEPER_EXCEPTION
        1000,  # POCO_EXCEPTION
    }
)


def is_transient(exc: BaseException) -> bool:
    """Whether retrying the same insert may succeed (network, timeout, too many parts...)."""
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    code = getattr(exc, "code", None)
    if isinstance(exc, DatabaseError) and isinstance(code, int):
        return code in TRANSIENT_CODES
    # Transport failures of the HTTP client carry no server code.
    return isinstance(exc, OperationalError)
