"""``prism-pipeline dashboards build [--out DIR]``: write Grafana dashboards and provisioning."""

from __future__ import annotations

import argparse
from pathlib import Path

from prism.dashboards import build_all, default_out_dir


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "dashboards",
        help="build the Grafana dashboards, datasource and alerting provisioning files",
        description=(
            "Builds the dashboards and alert rules (grafana-foundation-sdk), checks them "
            "offline and writes json/*.json and provisioning/{datasources,dashboards,"
            "alerting}/*.yaml, the folders docker-compose mounts into Grafana. The datasource "
            "reads $CLICKHOUSE_HOST (native protocol, port 9000, database prism); the alert "
            "webhook reads $PRISM_ALERT_WEBHOOK_URL."
        ),
    )
    p.add_argument("action", choices=["build"])
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"output folder (default: the repo's dashboards/ folder, {default_out_dir()})",
    )
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    paths = build_all(args.out)
    for path in paths:
        print(path)
    print(f"wrote {len(paths)} files")
    return 0
