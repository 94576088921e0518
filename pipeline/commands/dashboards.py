"""``prism-pipeline dashboards build [--out DIR]``: write Grafana dashboards and provisioning."""

from __future__ import annotations

import argparse
from pathlib import Path

from prism.dashboards import ChannelThresholds, build_all, default_out_dir


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "dashboards",
        help="build the Grafana dashboards, datasource and alerting provisioning files",
        description=(
            "Builds the dashboards and alert rules (grafana-foundation-sdk), checks them "
            "offline and writes json/*.json and provisioning/{datasources,dashboards,"
            "alerting}/*.yaml, the folders docker-compose mounts into Grafana. The datasource "
            "reads $CLICKHOUSE_HOST (native protocol, port 9000, database prism); the alert "
            "webhook reads $PRISM_ALERT_WEBHOOK_URL. Channel alert thresholds come from "
            "PRISM_ALERT_CHANNEL_OPEN_ITEM_MINUTES and "
            "PRISM_ALERT_CHANNEL_CAPACITY_DENIALS_PER_MINUTE."
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
    from ..settings import load_settings

    s = load_settings()
    channel = ChannelThresholds(
        open_item_minutes=s.alert_channel_open_item_minutes,
        capacity_denials_per_minute=s.alert_channel_capacity_denials_per_minute,
    )
    paths = build_all(args.out, channel=channel)
    for path in paths:
        print(path)
    print(f"wrote {len(paths)} files")
    return 0
