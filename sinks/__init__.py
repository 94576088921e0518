"""The ClickHouse ledger: connection, migrations, the effectively-once writer, queries, billing.

Everything goes through clickhouse-connect: ``chdb://<path>`` runs the embedded chDB
engine in-process (one engine path per process), ``http(s)://user:pw@host:port/db``
reaches a ClickHouse server. Storage tables (``*_store``) are ReplacingMergeTrees keyed on
stable ids; users query the views (``runs``, ``usage``, ``turns``, ``run_events``,
``cache_hits_1m``, ``quarantine``, ``dead_letters``, ``alerts``, ``billing_usage``).
``parse_dsn``/``redact_dsn`` are the one DSN parser and masked form (``SecretDsn``);
``read_only_query`` is the ad hoc surface (statement check + ``readonly = 1``);
``grants_sql`` the least-privilege accounts' DDL (SECURITY.md); ``billing_report``
(``refresh_billing_rollup`` for its day rollup), ``invoice`` and the price book
(``read_price_file``, ``load_prices``, ``price_book``) are billing (BILLING.md).

Example::

    from prism.sinks import LedgerWriter, SourceRange, connect, migrate

    client = connect("chdb://./.data/ledger", "prism")
    migrate(client, "prism")
    writer = LedgerWriter(client, "prism")
    writer.add(batch, SourceRange("prism.agent-events", 0, 100, 199))
    writer.flush()
"""

from prism.sinks._billing import (
    BILLING_SQL,
    DEFAULT_GROUP_BY,
    DIMENSIONS,
    BillingLine,
    BillingTotal,
    billing_report,
    billing_sql,
    billing_totals,
    refresh_billing_rollup,
)
from prism.sinks._client import (
    DsnTarget,
    SecretDsn,
    close_client,
    connect,
    parse_dsn,
    redact_dsn,
)
from prism.sinks._errors import (
    LedgerConfigError,
    LedgerConnectError,
    LedgerError,
    LedgerQueryError,
    LedgerReadOnlyError,
    LedgerWriteError,
    MigrationError,
    PriceBookError,
)
from prism.sinks._grants import (
    ALL_TENANTS,
    TENANT_SETTING,
    Account,
    accounts,
    grants_sql,
    sql_string,
)
from prism.sinks._invoice import Invoice, InvoiceLine, Reconciliation, invoice
from prism.sinks._migrate import load_migrations, migrate, render_migrations
from prism.sinks._prices import LoadSummary, PriceRow, load_prices, price_book, read_price_file
from prism.sinks._queries import QueryResult, query, run_timeline
from prism.sinks._readonly import check_read_only, read_only_query
from prism.sinks._state import StateTable
from prism.sinks._tables import STORAGE_TABLES, VIEWS
from prism.sinks._writer import INSERT_SETTINGS, FlushResult, InsertHook, LedgerWriter, SourceRange

__all__ = [
    "ALL_TENANTS",
    "BILLING_SQL",
    "DEFAULT_GROUP_BY",
    "DIMENSIONS",
    "INSERT_SETTINGS",
    "STORAGE_TABLES",
    "TENANT_SETTING",
    "VIEWS",
    "Account",
    "BillingLine",
    "BillingTotal",
    "DsnTarget",
    "FlushResult",
    "InsertHook",
    "Invoice",
    "InvoiceLine",
    "LedgerConfigError",
    "LedgerConnectError",
    "LedgerError",
    "LedgerQueryError",
    "LedgerReadOnlyError",
    "LedgerWriteError",
    "LedgerWriter",
    "LoadSummary",
    "MigrationError",
    "PriceBookError",
    "PriceRow",
    "QueryResult",
    "Reconciliation",
    "SecretDsn",
    "SourceRange",
    "StateTable",
    "accounts",
    "billing_report",
    "billing_sql",
    "billing_totals",
    "check_read_only",
    "close_client",
    "connect",
    "grants_sql",
    "invoice",
    "load_migrations",
    "load_prices",
    "migrate",
    "parse_dsn",
    "price_book",
    "query",
    "read_only_query",
    "read_price_file",
    "redact_dsn",
    "refresh_billing_rollup",
    "render_migrations",
    "run_timeline",
    "sql_string",
]
