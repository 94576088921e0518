"""``prism-pipeline grants``: the least-privilege ClickHouse accounts, as SQL or applied.

Without ``--execute`` the statements are printed, passwords as ``'${VARIABLE}'``
placeholders (fill them with ``envsubst``); with ``--execute`` they run against the
ledger's server as an administrator (an account with access management), each password
read from its environment variable and never printed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING

from prism.pipeline.commands._args import identifier, load_settings_from

if TYPE_CHECKING:
    from pydantic import SecretStr

    from prism.sinks import Account

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "grants",
        help="create the writer, reader and Grafana ClickHouse accounts (least privilege)",
        description=(
            "Prints (or with --execute applies) the DDL of three roles and their logins: "
            "prism_writer (the worker: INSERT/SELECT on the *_store tables only), "
            "prism_reader (billing and `query`: SELECT on the views, readonly=2) and "
            "prism_grafana (dashboards: SELECT on the views with row policies on tenant_id, "
            "readonly=1; prism_grafana sees every tenant, --tenant T adds "
            "prism_grafana_<t> which sees only T). Passwords come from CLICKHOUSE_WRITER_"
            "PASSWORD, CLICKHOUSE_READER_PASSWORD, CLICKHOUSE_GRAFANA_PASSWORD and "
            "CLICKHOUSE_GRAFANA_<TENANT>_PASSWORD; they are never printed. The server needs "
            "custom_settings_prefixes with SQL_ and settings_constraints_replace_previous "
            "(see SECURITY.md)."
        ),
    )
    p.add_argument(
        "--tenant",
        action="append",
        default=[],
        metavar="TENANT",
        help="also create a Grafana reader limited to this tenant (repeatable)",
    )
    p.add_argument(
        "--execute",
        action="store_true",
        help="apply the statements through --clickhouse (an administrator's DSN) instead of "
        "printing them",
    )
    p.add_argument(
        "--clickhouse",
        metavar="DSN",
        help="administrator DSN for --execute (default PRISM_CLICKHOUSE_DSN)",
    )
    p.add_argument(
        "--database",
        type=identifier,
        help="ledger database (default PRISM_CLICKHOUSE_DATABASE, prism)",
    )
    p.add_argument("--cluster", help="add ON CLUSTER (default PRISM_CLICKHOUSE_CLUSTER)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from prism.sinks import accounts, grants_sql

    settings = load_settings_from(
        args,
        {
            "--clickhouse": "clickhouse_dsn",
            "--database": "clickhouse_database",
            "--cluster": "clickhouse_cluster",
        },
    )
    database = settings.clickhouse_database
    cluster = settings.clickhouse_cluster
    if not args.execute:
        # all of them first: a bad --database or --tenant prints its error and nothing else
        statements = grants_sql(database, cluster=cluster, tenants=args.tenant)
        print(
            "-- prism-pipeline grants: least-privilege accounts for the ledger "
            f"{database!r} (SECURITY.md).\n-- Passwords are ${{VARIABLE}} placeholders: "
            "fill them with envsubst, or run `prism-pipeline grants --execute`."
        )
        for statement in statements:
            print(statement + ";")
        return 0
    users = accounts(args.tenant)
    missing = [a.password_env for a in users if not os.environ.get(a.password_env)]
    if missing:
        raise ValueError(
            f"--execute needs the account passwords in the environment; set {', '.join(missing)}"
        )
    placeholders = [
        a.password_env for a in users if os.environ[a.password_env].startswith("replace-with-")
    ]
    if placeholders:
        raise ValueError(
            f"{', '.join(placeholders)} still hold the placeholder of prism.env.example; "
            "set real passwords in .env"
        )
    return _execute(args, settings.clickhouse_dsn, database, cluster, users)


_IDENTIFIED_RE = re.compile(r"(IDENTIFIED\s+WITH\s+\w+\s+BY\s+).*?(\s+DEFAULT\s+DATABASE)", re.S)


def _mask(text: str, secrets: Iterable[str]) -> str:
    """``text`` without the passwords, however a server quoted or escaped them."""
    from prism.sinks import sql_string

    text = _IDENTIFIED_RE.sub(r"\1'***'\2", text)
    for secret in secrets:
        forms = {secret, sql_string(secret)[1:-1], repr(secret)[1:-1], json.dumps(secret)[1:-1]}
        for form in sorted(forms, key=len, reverse=True):
            text = text.replace(form, "***")
    return text


def _execute(
    args: argparse.Namespace,
    dsn: str | SecretStr,
    database: str,
    cluster: str | None,
    users: list[Account],
) -> int:
    from prism.sinks import LedgerQueryError, connect, grants_sql, sql_string

    passwords = {a.user: os.environ[a.password_env] for a in users}
    statements = grants_sql(
        database,
        cluster=cluster,
        tenants=args.tenant,
        password=lambda account: sql_string(passwords[account.user]),
    )
    client = connect(dsn)
    for number, statement in enumerate(statements, 1):
        try:
            client.command(statement)
        except Exception as exc:
            shown = _mask(statement, passwords.values())
            reason = _mask(str(exc).split("Stack trace", 1)[0].strip(), passwords.values())
            raise LedgerQueryError(
                f"grant statement {number}/{len(statements)} failed: {reason} "
                f"(statement: {shown[:160]!r}); the DSN must be an administrator with access "
                "management"
            ) from None
    print(
        f"applied {len(statements)} statements: accounts {', '.join(a.user for a in users)}",
        file=sys.stdout,
    )
    return 0
