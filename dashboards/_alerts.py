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
from typing import Any

from grafana_foundation_sdk.builders import alerting, expr
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import alerting as alerting_models
from grafana_foundation_sdk.models import dashboard as dashboard_models

from prism.dashboards._alert_rules import AlertThresholds, alert_specs
from prism.dashboards._budgets import budget_alert_spec
from prism.dashboards._channels import ChannelThresholds, channel_alert_specs
from prism.dashboards._clickhouse_query import ClickHouseQueryBuilder, QueryFormat, datasource_ref
from prism.dashboards._panels import dedent_sql, qualify

__all__ = [
    "ALERT_FOLDER",
    "ALERT_GROUP",
    "CONTACT_POINT",
    "DATASOURCE_UID",
    "RETIRED_RULE_UIDS",
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
# Rules provisioned by earlier versions: Grafana keeps a file-provisioned rule that leaves
# the file, so ``deleteRules`` removes them.
RETIRED_RULE_UIDS = ("prism-stale-runs", "prism-dead-letter-growth")


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
    channel_specs = channel_alert_specs(channel or ChannelThresholds())
    for s in [*alert_specs(thresholds), budget_alert_spec(), *channel_specs]:
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
            .annotations({"summary": s.summary, "description": s.description, "runbook": s.runbook})
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
            "deleteRules": [{"orgId": 1, "uid": uid} for uid in RETIRED_RULE_UIDS],
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
