"""``prism-pipeline dashboards build [--out DIR]``: write Grafana dashboards and provisioning."""

from __future__ import annotations

import argparse
from pathlib import Path

from prism.dashboards import AlertThresholds, ChannelThresholds, build_all, default_out_dir

from ..settings import Settings, load_settings


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "dashboards",
        help="build the Grafana dashboards, datasource and alerting provisioning files",
        description=(
            "Builds the dashboards and alert rules (grafana-foundation-sdk), checks them "
            "offline and writes json/*.json and provisioning/{datasources,dashboards,"
            "alerting}/*.yaml, the folders docker-compose mounts into Grafana. The datasource "
            "reads $CLICKHOUSE_HOST (native protocol, port 9000, database prism); the alert "
            "webhook reads $PRISM_ALERT_WEBHOOK_URL. Alert thresholds and windows come from "
            "the PRISM_ALERT_* settings (dashboards/README.md, 'Alert rules'; the channel "
            "rules' from PRISM_ALERT_CHANNEL_*); the committed files use the defaults."
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


def alert_thresholds(settings: Settings) -> AlertThresholds:
    """The alert rules' thresholds and windows from the ``PRISM_ALERT_*`` settings."""
    s = settings
    return AlertThresholds(
        exhaustion_per_minute=s.alert_exhaustion_per_minute,
        exhaustion_window_s=s.alert_exhaustion_window_seconds,
        dead_letter_window_s=s.alert_dead_letter_window_seconds,
        dead_letter_baseline_s=s.alert_dead_letter_baseline_seconds,
        dead_letter_factor=s.alert_dead_letter_factor,
        dead_letter_min_per_minute=s.alert_dead_letter_min_per_minute,
        stale_window_s=s.alert_stale_window_seconds,
        stale_baseline_s=s.alert_stale_baseline_seconds,
        stale_factor=s.alert_stale_factor,
        stale_min_runs=s.alert_stale_min_runs,
        freshness_s=s.alert_freshness_seconds,
        freshness_lookback_s=s.alert_freshness_lookback_seconds,
        freshness_expect_s=s.alert_freshness_expect_seconds,
    )


def channel_thresholds(settings: Settings) -> ChannelThresholds:
    """The channel alert rules' thresholds from the ``PRISM_ALERT_CHANNEL_*`` settings."""
    return ChannelThresholds(
        open_item_minutes=settings.alert_channel_open_item_minutes,
        capacity_denials_per_minute=settings.alert_channel_capacity_denials_per_minute,
    )


def _run(args: argparse.Namespace) -> int:
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        raise ValueError(f"--out {args.out} is a file; name a directory")
    settings = load_settings()
    paths = build_all(args.out, alert_thresholds(settings), channel_thresholds(settings))
    for path in paths:
        print(path)
    print(f"wrote {len(paths)} files")
    return 0
