"""Least-privilege ClickHouse accounts for the ledger, as DDL (``prism-pipeline grants``).

Three roles, each with a login of the same purpose (SECURITY.md has the threat model):

``prism_writer`` (user ``prism_writer``, the worker)
    INSERT and SELECT on the storage tables (``*_store``) and ``ingest_state`` (the state
    ``ingest-file`` keeps), SELECT on ``schema_migrations``; no DDL (the one-shot
    ``migrate`` runs as an administrator), no views, no other database.
``prism_reader`` (user ``prism_reader``, billing, ``query``, ``tail --from-ledger``)
    SELECT on the views, the storage tables they read and the price book (``prices``,
    ``prices_store``; an operator loads it); ``readonly = 2`` (settings may
    change for the driver, nothing may be written); every tenant.
``prism_grafana`` (user ``prism_grafana`` for all tenants, ``prism_grafana_<tenant>`` each)
    SELECT on the views and the storage tables they read, with row policies on
    ``tenant_id = getSetting('SQL_prism_tenant')`` (``'*'`` is every tenant); the tenant is a
    ``CONST`` setting of the user's profile with ``readonly = 1`` (only
    ``max_execution_time``, which the Grafana plugin sets, may change). Dead letters carry
    no trusted tenant: only ``'*'`` sees them.

Views run with the invoker's rights (ClickHouse's default ``SQL SECURITY INVOKER``), so a
reader of a view needs SELECT on its storage tables; the row policies sit on those tables
and therefore hold through the views and directly. The dead-letter grants name columns, so
the raw bytes older ledgers kept are out of reach. A table with any row policy shows only
what some policy allows, so an all-rows policy covers every other account.

Passwords never appear in the output: a statement reads ``'${CLICKHOUSE_WRITER_PASSWORD}'``
(expand it with ``envsubst``) unless ``password`` supplies the value, as
``prism-pipeline grants --execute`` does from the environment.

Example::

    for statement in grants_sql("prism", tenants=["acme"]):
        print(statement + ";")
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from prism.sinks._client import validate_identifier
from prism.sinks._errors import LedgerConfigError
from prism.sinks._prices import PRICE_TABLES
from prism.sinks._state import STATE_TABLE
from prism.sinks._tables import STORAGE_TABLES, VIEWS, columns_of

__all__ = [
    "ALL_TENANTS",
    "GRAFANA_SYSTEM_TABLES",
    "TENANT_SETTING",
    "Account",
    "accounts",
    "grants_sql",
    "sql_string",
]

TENANT_SETTING = "SQL_prism_tenant"
ALL_TENANTS = "*"
WRITER, READER, GRAFANA = "prism_writer", "prism_reader", "prism_grafana"
# Catalog tables the Grafana plugin reads (databases, tables, columns for its pickers);
# ClickHouse filters their rows to what the account may see.
GRAFANA_SYSTEM_TABLES = ("databases", "tables", "columns")
# What clickhouse-connect reads at connect time, plus the catalog (writer: column types).
DRIVER_SYSTEM_TABLES = ("settings", "databases", "tables", "columns")
MAX_EXECUTION_TIME = 60
_CLUSTER_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")


@dataclass(frozen=True, slots=True)
class Account:
    """A login: its user name, role, settings profile, tenant, and password variable."""

    user: str
    role: str
    profile: str | None
    tenant: str | None  # the grafana tenant ("*" for all); None for writer and reader
    password_env: str


def sql_string(value: str) -> str:
    """``value`` as a ClickHouse string literal (backslash, quote and control bytes escaped)."""
    escaped = (
        value.replace("\\", "\\\\")
        .replace("'", "\\'")
        .replace("\n", "\\n")
        .replace("\r", "\\r")
        .replace("\t", "\\t")
        .replace("\0", "\\0")
    )
    return f"'{escaped}'"


def _slug(tenant: str) -> str:
    slug = re.sub(r"[^a-z0-9_]+", "_", tenant.lower()).strip("_")[:40]
    if slug != tenant:  # keep names distinct when the tenant id needed changes
        slug = f"{slug}_{hashlib.sha256(tenant.encode()).hexdigest()[:8]}".lstrip("_")
    return slug


def accounts(tenants: Iterable[str] = ()) -> list[Account]:
    """The writer, the reader, the all-tenant Grafana reader and one Grafana reader per tenant."""
    out = [
        Account(WRITER, f"{WRITER}_role", None, None, "CLICKHOUSE_WRITER_PASSWORD"),
        Account(READER, f"{READER}_role", f"{READER}_profile", None, "CLICKHOUSE_READER_PASSWORD"),
        Account(
            GRAFANA, f"{GRAFANA}_role", f"{GRAFANA}_profile", ALL_TENANTS,
            "CLICKHOUSE_GRAFANA_PASSWORD",
        ),
    ]  # fmt: skip
    seen: set[str] = set()
    for tenant in tenants:
        if not tenant or len(tenant) > 128 or tenant == ALL_TENANTS:
            raise LedgerConfigError(
                f"tenant {tenant!r} cannot have a Grafana reader: give a tenant id of 1..128 "
                f"characters (not {ALL_TENANTS!r}, which stands for every tenant)"
            )
        slug = _slug(tenant)
        if slug in seen:
            continue
        seen.add(slug)
        out.append(
            Account(
                f"{GRAFANA}_{slug}",
                f"{GRAFANA}_role",
                f"{GRAFANA}_{slug}_profile",
                tenant,
                f"CLICKHOUSE_GRAFANA_{slug.upper()}_PASSWORD",
            )
        )
    return out


def _placeholder(account: Account) -> str:
    return "'${" + account.password_env + "}'"


# Stores without a tenant whose named rows every tenant may read (no tenant data in them).
_SHARED_ROWS = {"channel_watermark_store": "key = 'pipeline'"}


def grants_sql(
    database: str = "prism",
    *,
    cluster: str | None = None,
    tenants: Sequence[str] = (),
    password: Callable[[Account], str] | None = None,
) -> list[str]:
    """Every statement that creates or updates the accounts, roles, profiles and policies.

    Idempotent: roles are created if missing and their grants reset, profiles, policies
    and users replaced. ``password(account)`` returns the password *as SQL* (a literal);
    by default a ``'${VARIABLE}'`` placeholder.
    """
    validate_identifier(database)
    if cluster is not None and not _CLUSTER_RE.match(cluster):
        raise LedgerConfigError(
            f"cluster name {cluster!r} is not valid ([A-Za-z0-9_.-], at most 128 chars)"
        )
    on = f" ON CLUSTER `{cluster}`" if cluster else ""
    db = database
    users = accounts(tenants)
    roles = sorted({a.role for a in users})
    stores = [table for table, _ in STORAGE_TABLES.values()]
    # Columns a reader may read from each store (dead letters: never the raw bytes).
    readable = {
        table: ", ".join(columns_of(row)) if table == "dead_letters_store" else None
        for table, row in STORAGE_TABLES.values()
    }
    tenant_stores = [t for t, row in STORAGE_TABLES.values() if "tenant_id" in columns_of(row)]
    grafana_role = f"{GRAFANA}_role"

    def select_on(table: str) -> str:
        columns = readable.get(table)
        return f"SELECT({columns})" if columns else "SELECT"

    out = [f"CREATE ROLE IF NOT EXISTS {role}{on}" for role in roles]
    out.append(f"REVOKE{on} ALL ON *.* FROM {', '.join(roles)}")
    # The worker: its storage tables, nothing else.
    writer_role = f"{WRITER}_role"
    out += [f"GRANT{on} SELECT, INSERT ON {db}.{t} TO {writer_role}" for t in stores]
    out.append(f"GRANT{on} SELECT ON {db}.schema_migrations TO {writer_role}")
    # ingest-file keeps the core's state beside the ledger (sinks.StateTable).
    out.append(f"GRANT{on} SELECT, INSERT ON {db}.{STATE_TABLE} TO {writer_role}")
    # Readers: the views and what the views read.
    for role, system in ((f"{READER}_role", DRIVER_SYSTEM_TABLES),
                         (grafana_role, GRAFANA_SYSTEM_TABLES)):  # fmt: skip
        out += [f"GRANT{on} SELECT ON {db}.{v} TO {role}" for v in VIEWS]
        out += [f"GRANT{on} {select_on(t)} ON {db}.{t} TO {role}" for t in stores]
        out += [f"GRANT{on} SELECT ON system.{s} TO {role}" for s in system]
    out.append(f"GRANT{on} SELECT ON {db}.schema_migrations TO {READER}_role")
    # Billing reads the price book (loaded by an operator: `prism-pipeline prices load`).
    out += [f"GRANT{on} SELECT ON {db}.{t} TO {READER}_role" for t in PRICE_TABLES]
    out += [f"GRANT{on} SELECT ON system.{s} TO {writer_role}" for s in DRIVER_SYSTEM_TABLES]
    # Profiles: the reader may tune settings but never write; Grafana may change only the
    # timeout its plugin sets, and never its tenant.
    for account in users:
        if account.profile is None:
            continue
        if account.tenant is None:
            settings = "readonly = 2 CONST"
        else:
            settings = (
                f"readonly = 1 CONST, max_execution_time = {MAX_EXECUTION_TIME} "
                f"CHANGEABLE_IN_READONLY, {TENANT_SETTING} = {sql_string(account.tenant)} CONST"
            )
        out.append(f"CREATE SETTINGS PROFILE OR REPLACE {account.profile}{on} SETTINGS {settings}")
    # Row policies: the Grafana role sees its tenant; every other account sees every row.
    tenant = f"getSetting('{TENANT_SETTING}')"
    for table in stores:
        condition = (
            f"tenant_id = {tenant} OR {tenant} = '{ALL_TENANTS}'"
            if table in tenant_stores
            else f"{tenant} = '{ALL_TENANTS}'"  # no trusted tenant: all-tenant readers only
        )
        if table in _SHARED_ROWS:  # pipeline-wide rows every tenant's panels need
            condition += f" OR {_SHARED_ROWS[table]}"
        out.append(
            f"CREATE ROW POLICY OR REPLACE prism_tenant{on} ON {db}.{table} "
            f"FOR SELECT USING {condition} AS PERMISSIVE TO {grafana_role}"
        )
        out.append(
            f"CREATE ROW POLICY OR REPLACE prism_all_rows{on} ON {db}.{table} "
            f"FOR SELECT USING 1 AS PERMISSIVE TO ALL EXCEPT {grafana_role}"
        )
    # Logins.
    secret = password or _placeholder
    for account in users:
        profile = f" SETTINGS PROFILE '{account.profile}'" if account.profile else ""
        out.append(
            f"CREATE USER OR REPLACE {account.user}{on} IDENTIFIED WITH sha256_password BY "
            f"{secret(account)} DEFAULT DATABASE {db}{profile}"
        )
        out.append(f"GRANT{on} {account.role} TO {account.user}")
        out.append(f"ALTER USER {account.user}{on} DEFAULT ROLE {account.role}")
    return out
