"""Versioned migrations: ``sinks/migrations/NNNN_name.sql`` applied once, in order, recorded.

Each file is a template (placeholders ``${db}``, ``${on_cluster}``, ``${engine}``,
``${engine:<version column>}``, ``${dedup_window}``, ``${raw_event_ttl_days}``) holding
idempotent statements separated by ``;`` at a line end. ``migrate`` records each applied
file in ``<db>.schema_migrations`` (version, name, checksum, applied_at). The checksum is
the SHA-256 of the file's template text, so settings (TTL days, cluster) do not change
it, but an edit to an applied file does, and is refused.
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources

from clickhouse_connect.driver.client import Client

from prism.sinks._client import database_exists, validate_identifier
from prism.sinks._errors import LedgerConfigError, MigrationError

__all__ = [
    "DEDUP_WINDOW",
    "Migration",
    "RenderedMigration",
    "load_migrations",
    "migrate",
    "render_migrations",
    "render_sql",
]

log = logging.getLogger(__name__)

DEDUP_WINDOW = 10_000  # inserts whose tokens each table remembers (the replicated default)
REPLICA_PATH = "/clickhouse/tables/{shard}/{database}/{table}"
_FILE_RE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_PLACEHOLDER_RE = re.compile(r"\$\{(\w+)(?::(\w+))?\}")
_STATEMENT_END_RE = re.compile(r";[ \t]*(?:\n|$)")
_CLUSTER_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")
_TTL_RE = re.compile(r"toIntervalDay\((\d+)\)")


@dataclass(frozen=True, slots=True)
class Migration:
    """One migration file: its version, name, template text and checksum."""

    version: int
    name: str
    template: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.template.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class RenderedMigration:
    """A migration with its statements rendered for one database and engine choice."""

    migration: Migration
    statements: tuple[str, ...]


def load_migrations() -> list[Migration]:
    """The migration files shipped in ``sinks/migrations``, by version."""
    found: list[Migration] = []
    for entry in resources.files("prism.sinks").joinpath("migrations").iterdir():
        match = _FILE_RE.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"two migration files share a version number: {versions}")
    return found


def render_sql(
    template: str, database: str, *, cluster: str | None = None, raw_event_ttl_days: int = 90
) -> str:
    """Fill a migration template's placeholders.

    Example::

        render_sql("ENGINE = ${engine:version}", "prism", cluster="main")
        # "ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/{table}',
        #  '{replica}', version)"
    """
    validate_identifier(database)
    _check_cluster(cluster)
    if not isinstance(raw_event_ttl_days, int) or raw_event_ttl_days < 1:
        raise LedgerConfigError(
            f"raw_event_ttl_days={raw_event_ttl_days!r} must be a whole number of days >= 1"
        )

    def engine(version: str | None) -> str:
        if cluster is None:
            return f"ReplacingMergeTree({version})" if version else "ReplacingMergeTree"
        args = [f"'{REPLICA_PATH}'", "'{replica}'"] + ([version] if version else [])
        return f"ReplicatedReplacingMergeTree({', '.join(args)})"

    def fill(match: re.Match[str]) -> str:
        name, arg = match[1], match[2]
        if name == "engine":
            return engine(arg)
        if arg is not None:
            raise MigrationError(f"placeholder {match[0]!r} takes no argument")
        values = {
            "db": database,
            "on_cluster": f"ON CLUSTER `{cluster}`" if cluster else "",
            "dedup_window": (
                f"replicated_deduplication_window = {DEDUP_WINDOW}"
                if cluster
                else f"non_replicated_deduplication_window = {DEDUP_WINDOW}"
            ),
            "raw_event_ttl_days": str(raw_event_ttl_days),
        }
        if name not in values:
            raise MigrationError(
                f"unknown placeholder {match[0]!r} in a migration; known: "
                "${db}, ${on_cluster}, ${engine}, ${engine:<column>}, ${dedup_window}, "
                "${raw_event_ttl_days}"
            )
        return values[name]

    return _PLACEHOLDER_RE.sub(fill, template)


def render_migrations(
    database: str, *, cluster: str | None = None, raw_event_ttl_days: int = 90
) -> list[RenderedMigration]:
    """Every migration rendered into its statements (what ``migrate`` would run)."""
    return [
        RenderedMigration(
            m,
            _split(
                render_sql(
                    m.template, database, cluster=cluster, raw_event_ttl_days=raw_event_ttl_days
                )
            ),
        )
        for m in load_migrations()
    ]


def migrate(
    client: Client, database: str, *, cluster: str | None = None, raw_event_ttl_days: int = 90
) -> list[str]:
    """Create or upgrade the ledger in ``database``; return the names of newly applied migrations.

    Idempotent: a second run applies nothing. A changed TTL is applied with
    ``ALTER TABLE ... MODIFY TTL``.

    Example::

        client = connect("chdb://./.data/ledger", "prism")
        migrate(client, "prism")            # ["0001_storage", "0002_views"], then []
    """
    plan = render_migrations(database, cluster=cluster, raw_event_ttl_days=raw_event_ttl_days)
    on_cluster = f" ON CLUSTER `{cluster}`" if cluster else ""
    # Only DDL that is needed: an up-to-date ledger is checked with reads alone, so the
    # worker's least-privilege account (no DDL, see _grants.py) can start on it.
    if not database_exists(client, database):
        _run(client, f"CREATE DATABASE IF NOT EXISTS {database}{on_cluster}", "create the database")
    if not _table_exists(client, database, "schema_migrations"):
        _run(client, _migrations_table_sql(database, cluster), "create schema_migrations")
    applied = _applied(client, database)
    known = {r.migration.version for r in plan}
    unknown = sorted(set(applied) - known)
    if unknown:
        raise MigrationError(
            f"database {database!r} has migrations {unknown} that this version of "
            "prism-pipeline does not know; upgrade prism-pipeline before running it here"
        )
    done: list[str] = []
    for rendered in plan:
        m = rendered.migration
        label = f"{m.version:04d}_{m.name}"
        if m.version in applied:
            if applied[m.version] != m.checksum:
                raise MigrationError(
                    f"migration {label} was applied to {database!r} with checksum "
                    f"{applied[m.version][:12]}..., but the file now has {m.checksum[:12]}...; "
                    "applied migrations must not change: add a new NNNN_*.sql file instead"
                )
            continue
        for statement in rendered.statements:
            _run(client, statement, f"apply migration {label}")
        client.insert(
            f"{database}.schema_migrations",
            [[m.version, m.name, m.checksum, datetime.now(UTC)]],
            column_names=["version", "name", "checksum", "applied_at"],
        )
        log.info("applied migration %s to %s", label, database)
        done.append(label)
    _ensure_ttl(client, database, cluster, raw_event_ttl_days)
    if not client.database:
        client.database = database  # the ledger exists now: make it the default for ad hoc SQL
    return done


def _check_cluster(cluster: str | None) -> None:
    if cluster is not None and not _CLUSTER_RE.match(cluster):
        raise LedgerConfigError(
            f"cluster name {cluster!r} is not valid; use the name from remote_servers "
            "([A-Za-z0-9_.-], at most 128 chars)"
        )


def _split(sql: str) -> tuple[str, ...]:
    lines = [line for line in sql.splitlines() if not line.lstrip().startswith("--")]
    parts = _STATEMENT_END_RE.split("\n".join(lines) + "\n")
    return tuple(p.strip() for p in parts if p.strip())


def _migrations_table_sql(database: str, cluster: str | None) -> str:
    return render_sql(
        "CREATE TABLE IF NOT EXISTS ${db}.schema_migrations ${on_cluster} "
        "(version UInt32, name String, checksum String, applied_at DateTime64(3, 'UTC')) "
        "ENGINE = ${engine} ORDER BY version",
        database,
        cluster=cluster,
    )


def _table_exists(client: Client, database: str, table: str) -> bool:
    return bool(client.query(f"EXISTS TABLE {database}.{table}").result_rows[0][0])


def _applied(client: Client, database: str) -> dict[int, str]:
    rows = client.query(
        f"SELECT version, checksum FROM {database}.schema_migrations FINAL"
    ).result_rows
    return {int(v): str(c) for v, c in rows}


def _ensure_ttl(client: Client, database: str, cluster: str | None, days: int) -> None:
    result = client.query(
        "SELECT engine_full FROM system.tables WHERE database = {db:String} "
        "AND name = 'run_events_store'",
        parameters={"db": database},
    )
    if not result.result_rows:
        return
    match = _TTL_RE.search(str(result.result_rows[0][0]))
    if match and int(match[1]) == days:
        return
    on_cluster = f" ON CLUSTER `{cluster}`" if cluster else ""
    _run(
        client,
        f"ALTER TABLE {database}.run_events_store{on_cluster} "
        f"MODIFY TTL toDateTime(received_at) + INTERVAL {days} DAY",
        "change the raw event TTL",
    )
    log.info("raw event TTL of %s set to %d days", database, days)


def _run(client: Client, statement: str, what: str) -> None:
    try:
        client.command(statement)
    except Exception as exc:
        first = statement.splitlines()[0][:120]
        raise MigrationError(f"could not {what}: {exc} (statement: {first!r})") from exc
