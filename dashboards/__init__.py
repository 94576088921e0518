"""Grafana dashboards and alert rules as code (grafana-foundation-sdk 11.6), tested offline.

Nine dashboards (SRE overview, provider health, cost and usage, tools, pipeline, cache
efficiency, run explorer, channels and guardrails, and the report, which ``prism-pipeline
report`` also draws as an HTML page; see ``dashboards/README.md``) query the
ledger views through the ``grafana-clickhouse-datasource`` plugin, each with a
``datasource`` variable and a ``tenant`` filter. Variables take only what their query returns
and reach SQL percent-encoded inside ``decodeURLComponent('...')`` (``decoded``), so no value
breaks out of its literal; ``lint_dashboard`` refuses any other interpolation. ``build_all``
writes the dashboard JSON and
the provisioning files docker-compose mounts into Grafana; ``expand_query`` replays what
Grafana and the plugin do to a query, so tests can run every panel on a chDB ledger.

Example::

    from prism.dashboards import build_all
    build_all()                     # dashboards/json + dashboards/provisioning
"""

from prism.dashboards._alerts import (
    ALERT_FOLDER,
    ALERT_GROUP,
    CONTACT_POINT,
    DATASOURCE_UID,
    WEBHOOK_URL_ENV,
    AlertThresholds,
    alert_rules,
    alerting_files,
)
from prism.dashboards._budgets import (
    BUDGET_PANEL,
    BUDGET_RULE_UID,
    budget_alert_spec,
    budget_panel,
)
from prism.dashboards._cache import cache_efficiency
from prism.dashboards._channels import ChannelThresholds, channel_alert_specs, channels
from prism.dashboards._clickhouse_query import (
    PLUGIN_ID,
    ClickHouseQuery,
    ClickHouseQueryBuilder,
    QueryFormat,
    register_clickhouse_variant,
)
from prism.dashboards._cost import cost_and_usage
from prism.dashboards._errors import DashboardError, LintError, MacroError
from prism.dashboards._explorer import run_explorer
from prism.dashboards._lint import (
    lint_alerting,
    lint_dashboard,
    lint_expanded_sql,
    lint_money,
    lint_readability,
    unsafe_interpolations,
)
from prism.dashboards._macros import (
    ALERT_MACROS,
    ALL,
    TimeRange,
    Variable,
    apply_conditional_all,
    expand_alert_query,
    expand_backend_macros,
    expand_query,
    replace_variables,
)
from prism.dashboards._palette import OKABE_ITO, OTHER_COLOR, RUN_STATUSES, STATUS_COLORS
from prism.dashboards._panels import (
    CURRENCY,
    EVENT_TIME,
    RECEIVE_TIME,
    TENANT_FILTER,
    TOP_SERIES,
    decoded,
    selected,
    tenant_filter,
    time_axis,
    top_series,
)
from prism.dashboards._pipeline import pipeline
from prism.dashboards._provider import provider_health
from prism.dashboards._provisioning import (
    DASHBOARD_PATH,
    DASHBOARDS,
    build_all,
    dashboard_from_json,
    dashboard_json,
    datasource_file,
    default_out_dir,
    provider_file,
)
from prism.dashboards._report_panels import (
    REPORT_UID,
    ReportPanel,
    report_dashboard,
    report_panels,
)
from prism.dashboards._sre import sre_overview
from prism.dashboards._tools import tools

__all__ = [
    "ALERT_FOLDER",
    "ALERT_GROUP",
    "ALERT_MACROS",
    "ALL",
    "BUDGET_PANEL",
    "BUDGET_RULE_UID",
    "CONTACT_POINT",
    "CURRENCY",
    "DASHBOARDS",
    "DASHBOARD_PATH",
    "DATASOURCE_UID",
    "EVENT_TIME",
    "OKABE_ITO",
    "OTHER_COLOR",
    "PLUGIN_ID",
    "RECEIVE_TIME",
    "REPORT_UID",
    "RUN_STATUSES",
    "STATUS_COLORS",
    "TENANT_FILTER",
    "TOP_SERIES",
    "WEBHOOK_URL_ENV",
    "AlertThresholds",
    "ChannelThresholds",
    "ClickHouseQuery",
    "ClickHouseQueryBuilder",
    "DashboardError",
    "LintError",
    "MacroError",
    "QueryFormat",
    "ReportPanel",
    "TimeRange",
    "Variable",
    "alert_rules",
    "alerting_files",
    "apply_conditional_all",
    "budget_alert_spec",
    "budget_panel",
    "build_all",
    "cache_efficiency",
    "channel_alert_specs",
    "channels",
    "cost_and_usage",
    "dashboard_from_json",
    "dashboard_json",
    "datasource_file",
    "decoded",
    "default_out_dir",
    "expand_alert_query",
    "expand_backend_macros",
    "expand_query",
    "lint_alerting",
    "lint_dashboard",
    "lint_expanded_sql",
    "lint_money",
    "lint_readability",
    "pipeline",
    "provider_file",
    "provider_health",
    "register_clickhouse_variant",
    "replace_variables",
    "report_dashboard",
    "report_panels",
    "run_explorer",
    "selected",
    "sre_overview",
    "tenant_filter",
    "time_axis",
    "tools",
    "top_series",
    "unsafe_interpolations",
]
