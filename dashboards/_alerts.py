"""Alert rules, the webhook contact point and the notification policy, as provisioning files.

Rules are built with the SDK's alerting builders (query A on ClickHouse, B = reduce(last),
C = threshold on B) and written in Grafana's *file-provisioning* shape (``groups`` with
``orgId``/``name``/``folder``/``interval``/``rules``), not the HTTP API shape the SDK's
``to_json`` emits. Alert SQL uses only the plugin's backend macros: Grafana evaluates rules
without a dashboard, so template variables and ``$__conditionalAll`` would reach
ClickHouse unexpanded. Query models are provisioned raw (not env-interpolated); labels and
contact-point settings are interpolated, which is how the webhook URL comes from
``$PRISM_ALERT_WEBHOOK_URL``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from grafana_foundation_sdk.builders import alerting, expr
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import alerting as alerting_models
from grafana_foundation_sdk.models import dashboard as dashboard_models

from prism.dashboards._channels import ChannelThresholds, channel_alert_specs
from prism.dashboards._clickhouse_query import ClickHouseQueryBuilder, QueryFormat, datasource_ref
from prism.dashboards._panels import dedent_sql, qualify

__all__ = [
    "ALERT_FOLDER",
    "ALERT_GROUP",
    "CONTACT_POINT",
    "DATASOURCE_UID",
    "WEBHOOK_URL_ENV",
    "AlertThresholds",
    "alert_rules",
    "alerting_files",
]

DATASOURCE_UID = "prism-clickhouse"
ALERT_FOLDER = "Prism"
ALERT_GROUP = "prism-pipeline"
CONTACT_POINT = "prism-webhook"
WEBHOOK_URL_ENV = "PRISM_ALERT_WEBHOOK_URL"
_EXPR = "__expr__"


@dataclass(frozen=True)
class AlertThresholds:
    """Thresholds and windows of the provisioned alert rules (defaults suit a small fleet)."""

    exhaustion_per_minute: float = 1.0  # limit deaths per minute on one axis
    exhaustion_window_s: int = 600
    stale_runs: int = 0  # fires above this many incomplete runs
    stale_window_s: int = 86_400
    dead_letters: int = 0  # fires above this many new dead letters in the window
    dead_letter_window_s: int = 300
    freshness_s: float = 300.0  # fires when the newest event is older than this
    freshness_window_s: int = 3_600


@dataclass(frozen=True)
class _Spec:
    uid: str
    title: str
    sql: str
    window_s: int
    threshold: float
    summary: str
    description: str
    severity: str
    no_data: str  # "OK" | "NoData" | "Alerting"
    for_: str


def _specs(t: AlertThresholds) -> list[_Spec]:
    return [
        _Spec(
            "prism-limit-exhaustion-rate",
            "Run-limit exhaustion rate per axis",
            """
            SELECT axis,
                   count() / (dateDiff('second', $__fromTime, $__toTime) / 60) AS deaths_per_minute
            FROM (
                SELECT ifNull(exhaustion_axis, exhaustion_limit) AS axis,
                       ifNull(finished_at, last_event_at) AS died_at
                FROM runs
                WHERE exhaustion_limit IS NOT NULL OR exhaustion_axis IS NOT NULL
            )
            WHERE $__timeFilter(died_at)
            GROUP BY axis
            """,
            t.exhaustion_window_s,
            t.exhaustion_per_minute,
            "Runs are dying on limit {{ $labels.axis }}",
            f"More than {t.exhaustion_per_minute:g} runs per minute died on the "
            "{{ $labels.axis }} limit over the last "
            f"{t.exhaustion_window_s // 60} minutes.",
            "warning",
            "OK",
            "5m",
        ),
        _Spec(
            "prism-stale-runs",
            "Stale (incomplete) runs",
            """
            SELECT count() AS incomplete_runs
            FROM runs
            WHERE status = 'incomplete' AND $__timeFilter(last_event_at)
            """,
            t.stale_window_s,
            float(t.stale_runs),
            "Runs without a terminal event",
            f"More than {t.stale_runs} runs active in the last {t.stale_window_s // 3600} h "
            "are marked incomplete (no terminal within the stale threshold).",
            "warning",
            "OK",
            "0s",
        ),
        _Spec(
            "prism-dead-letter-growth",
            "Dead-letter growth",
            """
            SELECT count() AS new_dead_letters
            FROM dead_letters
            WHERE $__timeFilter(received_at)
            """,
            t.dead_letter_window_s,
            float(t.dead_letters),
            "Records are going to the dead-letter log",
            f"More than {t.dead_letters} records could not be parsed or broke the contract in "
            f"the last {t.dead_letter_window_s // 60} minutes.",
            "critical",
            "OK",
            "0s",
        ),
        _Spec(
            "prism-ingest-freshness",
            "Ingest freshness",
            """
            SELECT dateDiff('second', max(received_at), now()) AS freshness_s
            FROM run_events
            WHERE $__timeFilter(received_at)
            """,
            t.freshness_window_s,
            t.freshness_s,
            "The ledger stopped receiving events",
            f"The newest event reached the ledger more than {t.freshness_s:g} s ago (no "
            f"event at all in the last {t.freshness_window_s // 60} minutes reads as stale).",
            "critical",
            "Alerting",
            "2m",
        ),
    ]


def _expr_ref() -> dashboard_models.DataSourceRef:
    return dashboard_models.DataSourceRef(type_val=_EXPR, uid=_EXPR)


def alert_rules(
    thresholds: AlertThresholds = AlertThresholds(),
    database: str | None = None,
    channel: ChannelThresholds | None = None,
) -> list[alerting_models.Rule]:
    """The SDK rule models (HTTP API shape); ``alerting_files`` writes them for provisioning.

    Example::

        rules = alert_rules(AlertThresholds(freshness_s=120))
    """
    rules = []
    extra = [_Spec(**kw) for kw in channel_alert_specs(channel or ChannelThresholds())]
    for s in _specs(thresholds) + extra:
        query = (
            ClickHouseQueryBuilder("A")
            .raw_sql(qualify(dedent_sql(s.sql), database))
            .format(QueryFormat.TABLE)
            .datasource(datasource_ref(DATASOURCE_UID))
        )
        reduce = (
            expr.TypeReduce()
            .ref_id("B")
            .expression("A")
            .reducer("last")
            .settings(expr.ExprTypeReduceSettings().mode("dropNN"))
            .datasource(_expr_ref())
        )
        threshold = (
            expr.TypeThreshold()
            .ref_id("C")
            .expression("B")
            .conditions(
                [
                    expr.ExprTypeThresholdConditions().evaluator(
                        expr.ExprTypeThresholdConditionsEvaluator().type("gt").params([s.threshold])
                    )
                ]
            )
            .datasource(_expr_ref())
        )
        rule = (
            alerting.Rule(s.title)
            .uid(s.uid)
            .org_id(1)
            .rule_group(ALERT_GROUP)
            .folder_uid(ALERT_FOLDER)
            .condition("C")
            .with_query(
                alerting.Query("A")
                .datasource_uid(DATASOURCE_UID)
                .relative_time_range(alerting_models.RelativeTimeRange(from_val=s.window_s, to=0))
                .model(query)
            )
            .with_query(
                alerting.Query("B")
                .datasource_uid(_EXPR)
                .relative_time_range(alerting_models.RelativeTimeRange(from_val=0, to=0))
                .model(reduce)
            )
            .with_query(
                alerting.Query("C")
                .datasource_uid(_EXPR)
                .relative_time_range(alerting_models.RelativeTimeRange(from_val=0, to=0))
                .model(threshold)
            )
            .no_data_state(s.no_data)  # type: ignore[arg-type]
            .exec_err_state("Error")
            .for_val(s.for_)
            .annotations({"summary": s.summary, "description": s.description})
            .labels({"team": "prism", "severity": s.severity, "component": "pipeline"})
            .is_paused(False)
        )
        rules.append(rule.build())
    return rules


def _plain(obj: object) -> Any:
    return json.loads(json.dumps(obj, cls=JSONEncoder))


def _file_rule(rule: alerting_models.Rule) -> dict[str, Any]:
    api = _plain(rule)
    return {
        "uid": api["uid"],
        "title": api["title"],
        "condition": api["condition"],
        "data": [
            {
                "refId": q["refId"],
                "relativeTimeRange": q["relativeTimeRange"],
                "datasourceUid": q["datasourceUid"],
                "model": q["model"],
            }
            for q in api["data"]
        ],
        "noDataState": api["noDataState"],
        "execErrState": api["execErrState"],
        "for": api["for"],
        "annotations": api["annotations"],
        "labels": api["labels"],
        "isPaused": api.get("isPaused", False),
    }


def alerting_files(
    thresholds: AlertThresholds = AlertThresholds(),
    database: str | None = None,
    channel: ChannelThresholds | None = None,
) -> dict[str, dict[str, Any]]:
    """File name -> content of ``provisioning/alerting``: rules, contact point, policy.

    Example::

        files = alerting_files()
        files["alert-rules.yaml"]["groups"][0]["rules"][0]["title"]
    """
    group = alerting.RuleGroup(ALERT_GROUP).interval(60).build()
    contact = (
        alerting.ContactPoint()
        .uid(CONTACT_POINT)
        .name(CONTACT_POINT)
        .type("webhook")
        .settings({"url": f"${WEBHOOK_URL_ENV}", "httpMethod": "POST"})
        .disable_resolve_message(False)
        .build()
    )
    policy = _plain(
        alerting.NotificationPolicy()
        .receiver(CONTACT_POINT)
        .group_by(["grafana_folder", "alertname"])
        .group_wait("30s")
        .group_interval("5m")
        .repeat_interval("4h")
        .build()
    )
    receiver = _plain(contact)
    return {
        "alert-rules.yaml": {
            "apiVersion": 1,
            "groups": [
                {
                    "orgId": 1,
                    "name": group.title,
                    "folder": ALERT_FOLDER,
                    "interval": f"{group.interval}s",
                    "rules": [_file_rule(r) for r in alert_rules(thresholds, database, channel)],
                }
            ],
        },
        "contact-points.yaml": {
            "apiVersion": 1,
            "contactPoints": [
                {
                    "orgId": 1,
                    "name": receiver["name"],
                    "receivers": [
                        {
                            "uid": receiver["uid"],
                            "type": receiver["type"],
                            "settings": receiver["settings"],
                            "disableResolveMessage": receiver["disableResolveMessage"],
                        }
                    ],
                }
            ],
        },
        "notification-policies.yaml": {"apiVersion": 1, "policies": [{"orgId": 1, **policy}]},
    }
