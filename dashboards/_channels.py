"""The Channels dashboard (messaging-channel operations, guardrail denials) and its alert rules.

Panels read the channel views of the ledger (``channel_operations``, ``channel_open_items``,
``channel_denials``) and ``guardrail_denials``. The alert rules page on-call for open items
(a send that threw, a process that died while claimed) older than a threshold, for capacity
denials per connection, and for stuck operations; ``channel_alert_specs`` builds them for
``_alerts.alert_rules``.
"""

from __future__ import annotations

from dataclasses import dataclass

from grafana_foundation_sdk.models import dashboard as dashboard_models

from prism.dashboards._alert_rules import AlertSpec
from prism.dashboards._panels import (
    TENANT_FILTER,
    Board,
    bars,
    ch,
    stat_panel,
    table_panel,
    timeseries_panel,
)

__all__ = ["RUNBOOK_OPEN_ITEMS", "UID", "ChannelThresholds", "channel_alert_specs", "channels"]

UID = "prism-channels"

RUNBOOK_OPEN_ITEMS = (
    "What it means: a channel operation is in delivery_unknown (the send threw: the reply "
    "may or may not have reached the user) or execution_unknown (the process died while the "
    "operation was claimed). Neither is ever retried automatically.\n\n"
    "Query to run:\n"
    'prism-pipeline query "SELECT * FROM channel_open_items ORDER BY age_seconds DESC"\n'
    "prism-pipeline tail --operation <operation_id> --format pretty\n\n"
    "What to do: for delivery_unknown, look at the conversation on the platform: if the "
    "reply arrived, reconcile with acknowledged; if not, reconcile with resent, which "
    "resends the persisted reply (on the host: runtime.reconcile({identity, connectionId, "
    "operationId, expectedVersion, acknowledgeDuplicateRisk: true})). For "
    "execution_unknown, review the run (run_id in channel_operations; tool side effects are "
    "not rolled back), then reconcile with acknowledged. The host publishes the reconciled "
    "transition and the item leaves the view."
)


@dataclass(frozen=True)
class ChannelThresholds:
    """Thresholds of the channel alert rules (``PRISM_ALERT_CHANNEL_*`` settings)."""

    open_item_minutes: float = 30.0  # an open item older than this pages
    capacity_denials_per_minute: float = 1.0  # per connection, over the window
    capacity_window_s: int = 600
    stuck_operations: int = 0  # fires above this many stuck operations

    def __post_init__(self) -> None:
        for name in ("open_item_minutes", "capacity_denials_per_minute"):
            value = getattr(self, name)
            if not value >= 0:
                raise ValueError(f"ChannelThresholds.{name} must be >= 0, got {value!r}")


def channel_alert_specs(t: ChannelThresholds = ChannelThresholds()) -> list[AlertSpec]:
    """The channel rules: open items, capacity denials per connection, stuck operations."""
    window_min = t.capacity_window_s / 60
    return [
        AlertSpec(
            "prism-channel-open-items",
            "Channel open item unreconciled",
            f"""
            SELECT count() AS old_open_items
            FROM channel_open_items
            WHERE age_seconds > {t.open_item_minutes * 60:g}
            """,
            3600,
            0.0,
            "Channel operations wait for a host reconcile",
            f"At least one delivery_unknown or execution_unknown operation is older than "
            f"{t.open_item_minutes:g} minutes of event time; nothing retries it.",
            RUNBOOK_OPEN_ITEMS,
            "critical",
            "OK",
            "0s",
        ),
        AlertSpec(
            "prism-channel-capacity-denials",
            "Channel capacity denials per connection",
            f"""
            SELECT connection_id, sum(count) / {window_min:g} AS capacity_denials_per_minute
            FROM channel_denials
            WHERE reason = 'capacity' AND $__timeFilter(minute)
            GROUP BY connection_id
            """,
            t.capacity_window_s,
            t.capacity_denials_per_minute,
            "Connection {{ $labels.connection_id }} is denying admissions for capacity",
            f"More than {t.capacity_denials_per_minute:g} admissions per minute were denied "
            "for capacity on {{ $labels.connection_id }} over the last "
            f"{window_min:g} minutes.",
            "What it means: the messaging runtime's pending limits (maxPendingPerBinding, "
            "per process, active sessions) are saturated: users are turned away.\n\n"
            "Query to run:\n"
            'prism-pipeline query "SELECT minute, connection_id, count FROM channel_denials '
            "WHERE reason = 'capacity' ORDER BY minute DESC LIMIT 60\"\n\n"
            "What to do: check the runs behind the connection (slow provider, long tool "
            "calls, stuck operations); raise the limits or add processes if the load is "
            "legitimate.",
            "warning",
            "OK",
            "5m",
        ),
        AlertSpec(
            "prism-channel-stuck-operations",
            "Stuck channel operations",
            """
            SELECT count() AS stuck_operations
            FROM channel_operations
            WHERE stuck
            """,
            3600,
            float(t.stuck_operations),
            "Channel operations are stuck executing",
            f"More than {t.stuck_operations} operations have been executing for longer than "
            "PRISM_CHANNEL_STUCK_SECONDS of event time (the hard cap of stopDeadlineMs).",
            "What it means: a run that never finished, or a process that died before a "
            "reconcile filed the operation as execution_unknown.\n\n"
            "Query to run:\n"
            'prism-pipeline query "SELECT operation_id, connection_id, run_id, since FROM '
            'channel_operations WHERE stuck ORDER BY since"\n\n'
            "What to do: look up the run (prism-pipeline tail --run <run_id>); if the host "
            "process died, run the host's listUnresolved and reconcile, which files the "
            "operation as execution_unknown for review.",
            "warning",
            "OK",
            "0s",
        ),
    ]


def channels(database: str | None = None) -> dashboard_models.Dashboard:
    """Messaging channels and guardrails: operations by state, open items, stuck operations,
    denials, admitted-to-delivered latency, guardrail denials by pack and rule.

    Example::

        model = channels()            # plain view names, for Grafana
        model = channels("t_1234")    # views of another database, for tests
    """
    b = Board(
        UID,
        "Prism / Channels",
        "Messaging-channel operations (prism.channel-operations): their states, open items "
        "waiting for a host reconcile, stuck operations, admission denials, end-to-end "
        "latency; and guardrail-pack denials of runs.",
        database=database,
        tags=("prism", "channels"),
        time_from="now-24h",
    )
    b.row("Operations")
    b.add(
        stat_panel(
            "Open items",
            "delivery_unknown or execution_unknown operations no host has reconciled (never "
            "retried automatically; see the alert's runbook).",
            "short",
            ch(f"SELECT count() AS open_items FROM channel_open_items WHERE {TENANT_FILTER}"),
            thresholds=((None, "green"), (1, "red")),
        ),
        stat_panel(
            "Oldest open item",
            "Age of the oldest open item at the pipeline's event-time watermark.",
            "s",
            ch(
                f"SELECT max(age_seconds) AS oldest_s FROM channel_open_items WHERE {TENANT_FILTER}"
            ),
            thresholds=((None, "green"), (1800, "red")),
            decimals=0,
        ),
        stat_panel(
            "Stuck operations",
            "Operations executing for longer than PRISM_CHANNEL_STUCK_SECONDS of event time.",
            "short",
            ch(f"SELECT countIf(stuck) AS stuck FROM channel_operations WHERE {TENANT_FILTER}"),
            thresholds=((None, "green"), (1, "orange")),
        ),
        stat_panel(
            "Capacity denials (range)",
            "Admissions denied for capacity in the time range (an SRE signal: pending limits "
            "are saturated).",
            "short",
            ch(
                f"""
                SELECT sum(count) AS capacity_denials
                FROM channel_denials
                WHERE reason = 'capacity' AND $__timeFilter(minute) AND {TENANT_FILTER}
                """
            ),
            thresholds=((None, "green"), (1, "orange")),
        ),
    )
    b.add(
        bars(
            "Operations by state",
            "Operations first seen in the time range, by their current state (no state: only "
            "records that were illegal so far).",
            "short",
            ch(
                f"""
                SELECT ifNull(state, '(none)') AS state, count() AS operations
                FROM channel_operations
                WHERE $__timeFilter(first_ts) AND {TENANT_FILTER}
                GROUP BY state
                ORDER BY operations DESC
                """
            ),
        ),
        timeseries_panel(
            "Admitted to delivered latency",
            "Seconds from admission to delivery of delivered operations: median and p95 per "
            "interval, by delivery time.",
            "s",
            [
                ch(
                    f"""
                    SELECT $__timeInterval(delivered_at) AS time,
                           quantile(0.5)(dateDiff('millisecond', admitted_at, delivered_at))
                               / 1000 AS p50,
                           quantile(0.95)(dateDiff('millisecond', admitted_at, delivered_at))
                               / 1000 AS p95
                    FROM channel_operations
                    WHERE state = 'delivered' AND admitted_at IS NOT NULL
                      AND $__timeFilter(delivered_at) AND {TENANT_FILTER}
                    GROUP BY time
                    ORDER BY time
                    """
                )
            ],
        ),
    )
    b.add(
        bars(
            "Quarantined channel records by reason",
            "Valid channel records the operation semantics rejected in the time range: "
            "illegal_transition (not a legal successor of the state reached at its seq) or "
            "duplicate_seq (another record holds the seq). A producer bug, not a user error.",
            "short",
            ch(
                f"""
                SELECT reason, count() AS records
                FROM channel_quarantine
                WHERE $__timeFilter(ts) AND {TENANT_FILTER}
                GROUP BY reason
                ORDER BY records DESC
                """
            ),
            w=24,
            h=6,
        )
    )
    b.row("Open items and stuck operations")
    b.add(
        table_panel(
            "Open items with age",
            "Every unreconciled delivery_unknown / execution_unknown operation, oldest first.",
            "short",
            ch(
                f"""
                SELECT operation_id, connection_id, tenant_id, state, since, age_seconds
                FROM channel_open_items
                WHERE {TENANT_FILTER}
                ORDER BY age_seconds DESC
                LIMIT 500
                """
            ),
            w=12,
            field_units={"age_seconds": "s"},
        ),
        table_panel(
            "Stuck operations, longest first",
            "Operations executing past the stuck threshold (PRISM_CHANNEL_STUCK_SECONDS).",
            "short",
            ch(
                f"""
                SELECT operation_id, connection_id, tenant_id, kind, run_id, since
                FROM channel_operations
                WHERE stuck AND {TENANT_FILTER}
                ORDER BY since
                LIMIT 500
                """
            ),
            w=12,
        ),
    )
    b.row("Denials")
    b.add(
        timeseries_panel(
            "Denials by reason",
            "Admission denials per interval by reason (capacity, unauthorized, ...).",
            "short",
            [
                ch(
                    f"""
                    SELECT $__timeInterval(minute) AS time, reason, sum(count) AS denials
                    FROM channel_denials
                    WHERE $__timeFilter(minute) AND {TENANT_FILTER}
                    GROUP BY time, reason
                    ORDER BY time
                    """
                )
            ],
            stacked=True,
            bars_style=True,
        ),
        bars(
            "Denials by connection",
            "Admission denials in the time range per channel connection.",
            "short",
            ch(
                f"""
                SELECT connection_id, sum(count) AS denials
                FROM channel_denials
                WHERE $__timeFilter(minute) AND {TENANT_FILTER}
                GROUP BY connection_id
                ORDER BY denials DESC
                """
            ),
        ),
    )
    b.row("Guardrails")
    b.add(
        timeseries_panel(
            "Guardrail denials by pack",
            "Steps denied by guardrail packs (migrate-to-0.9 section 7) per interval.",
            "short",
            [
                ch(
                    f"""
                    SELECT $__timeInterval(ts) AS time, pack, count() AS denials
                    FROM guardrail_denials
                    WHERE $__timeFilter(ts) AND {TENANT_FILTER}
                    GROUP BY time, pack
                    ORDER BY time
                    """
                )
            ],
            stacked=True,
        ),
        bars(
            "Guardrail denials by rule",
            "Denials in the time range per pack rule (pack:<pack>/<rule>) and stage.",
            "short",
            ch(
                f"""
                SELECT concat(rule, ' (', stage, ')') AS rule_stage, count() AS denials
                FROM guardrail_denials
                WHERE $__timeFilter(ts) AND {TENANT_FILTER}
                GROUP BY rule_stage
                ORDER BY denials DESC
                """
            ),
        ),
    )
    return b.build()
