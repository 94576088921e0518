"""Offline checks of the generated Grafana files (no Grafana server needed).

Each ``lint_*`` function returns a list of problems (empty when clean), one line each,
naming the dashboard/panel/rule and the offending value.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

from prism.dashboards._clickhouse_query import DATASOURCE_VARIABLE_REF, PLUGIN_ID
from prism.dashboards._errors import DashboardError, MacroError
from prism.dashboards._macros import TimeRange, Variable, expand_alert_query, expand_query
from prism.dashboards._panels import CURRENCY, time_axis

__all__ = [
    "lint_alerting",
    "lint_dashboard",
    "lint_expanded_sql",
    "lint_money",
    "lint_readability",
    "unsafe_interpolations",
]

_VAR_RE = re.compile(r"\$(\w+)|\$\{(\w+)[^}]*\}|\[\[(\w+)")
# The two safe ways a dashboard variable reaches SQL: percent-encoded inside a literal
# ClickHouse decodes, or as the variable argument of $__conditionalAll.
_SAFE_REF_RE = re.compile(r"decodeURLComponent\('\$\{\w+:percentencode\}'\)|,\s*\$\w+\s*\)")
_DURATION_RE = re.compile(r"^(\d+[smhdw])+$")
_EXPR_UID = "__expr__"
# What every rule's runbook annotation tells the person paged.
_RUNBOOK_PARTS = ("What it means:", "Query to run:", "What to do:")
# Any fixed range will do: alert SQL is expanded only to see that nothing is left over.
_PROBE = TimeRange(datetime(2024, 1, 1, tzinfo=UTC), datetime(2024, 1, 1, 1, tzinfo=UTC))

# Money: a sum of cost, and the clauses that group, rank and cut it.
_COST_SUM_RE = re.compile(r"\bsum\w*\(\s*(?:\w+\.)?cost\b", re.IGNORECASE)
_CLAUSE_END = r"(?=\bORDER\s+BY\b|\bLIMIT\b|\bHAVING\b|\bSETTINGS\b|\)|$)"
_GROUP_RE = re.compile(r"\bGROUP\s+BY\s+(.+?)" + _CLAUSE_END, re.IGNORECASE | re.DOTALL)
_ORDER_RE = re.compile(
    r"\bORDER\s+BY\s+(.+?)(?=\bLIMIT\b|\)|$)(?:\s*LIMIT\s+\d+(\s+BY\s+[\w, ]+)?)?",
    re.IGNORECASE | re.DOTALL,
)
_ONE_CURRENCY = f"${{{CURRENCY}:percentencode}}"
# Series labels with a handful of values: a stack of them stays readable without folding.
_BOUNDED_SERIES = {
    "time", "status", "axis", "code", "reason", "confidence", "class", "state", "transition",
    "pack",
}  # fmt: skip
_TOP_FORM = ("dense_rank() OVER", "'other'")


def _walk_datasources(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "datasource":
                yield f"{path}.{key}", value
            yield from _walk_datasources(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk_datasources(value, f"{path}[{i}]")


def _is_var_ref(ref: Any) -> bool:
    return isinstance(ref, dict) and ref.get("uid") == DATASOURCE_VARIABLE_REF


def lint_dashboard(dash: Mapping[str, Any]) -> list[str]:
    """Rules every dashboard JSON must follow; see the module docstring of ``dashboards``."""
    name = dash.get("uid") or dash.get("title") or "<dashboard>"
    problems: list[str] = []
    variables = {v.get("name"): v for v in dash.get("templating", {}).get("list", [])}

    ds_var = variables.get("datasource")
    if not ds_var or ds_var.get("type") != "datasource" or ds_var.get("query") != PLUGIN_ID:
        problems.append(
            f"{name}: needs a 'datasource' variable of type datasource for {PLUGIN_ID}, "
            f"got {ds_var!r}"
        )
    tenant = variables.get("tenant")
    if not tenant or tenant.get("type") != "query":
        problems.append(f"{name}: needs a 'tenant' query variable, got {tenant!r}")
    elif not (tenant.get("includeAll") and tenant.get("multi")):
        problems.append(f"{name}: the 'tenant' variable must be multi-select with All")
    for var_name, var in variables.items():
        if var.get("type") != "query":
            continue
        if var.get("allowCustomValue") is not False:
            problems.append(
                f"{name}: query variable {var_name!r} allows custom values; set "
                "allowCustomValue false so only what its query returns can be selected"
            )
        problems += unsafe_interpolations(
            f"{name}/variable {var_name}", var.get("query") or "", variables
        )
        if var.get("refresh") != 2:
            problems.append(
                f"{name}: query variable {var_name!r} has refresh={var.get('refresh')!r}; "
                "use 2 (on time range change)"
            )
        if not _is_var_ref(var.get("datasource")):
            problems.append(
                f"{name}: query variable {var_name!r} uses datasource {var.get('datasource')!r}"
                f"; use {{uid: {DATASOURCE_VARIABLE_REF!r}}}"
            )

    for path, ref in _walk_datasources(dash):
        uid = ref.get("uid") if isinstance(ref, dict) else ref
        if uid != DATASOURCE_VARIABLE_REF:
            problems.append(
                f"{name}: {path} is {ref!r}; reference the datasource as "
                f"{DATASOURCE_VARIABLE_REF!r}, never a fixed uid"
            )

    probe_vars = [Variable(str(n), ["x"] if v.get("multi") else "x") for n, v in variables.items()]
    for var_name, var in variables.items():
        if var.get("type") == "query":
            problems += _lint_sql(f"{name}/variable {var_name}", var.get("query") or "", probe_vars)

    ids = Counter(p.get("id") for p in dash.get("panels", []))
    problems += [f"{name}: panel id {i!r} is used {n} times" for i, n in ids.items() if n > 1]
    for panel in dash.get("panels", []):
        if panel.get("type") == "row":
            continue
        title = f"{name}/{panel.get('title', panel.get('id'))!s}"
        problems += _lint_panel(title, panel, variables)
        problems += lint_readability(title, panel)
        for target in panel.get("targets") or []:
            sql = target.get("rawSql") or ""
            problems += _lint_sql(f"{title}/{target.get('refId')}", sql, probe_vars)
            problems += lint_money(f"{title}/{target.get('refId')}", panel, sql)
    return problems


def lint_money(where: str, panel: Mapping[str, Any], sql: str) -> list[str]:
    """Amounts in different currencies never add up, and never rank against each other.

    A query summing ``cost`` either shows one currency (the panel repeats over
    ``$currency`` and filters on it) or groups by currency, and ranks (ORDER BY ... cost,
    LIMIT) within a currency; a time series always shows one currency, so no axis carries
    two.
    """
    if not _COST_SUM_RE.search(sql):
        return []
    if panel.get("repeat") == CURRENCY and _ONE_CURRENCY in sql:
        return []
    if panel.get("type") == "timeseries":
        return [
            f"{where}: plots cost of several currencies on one axis; repeat the panel over "
            f"${CURRENCY} and filter on currency_filter()"
        ]
    problems = []
    for match in _COST_SUM_RE.finditer(sql):
        group = _GROUP_RE.search(sql, match.end())
        if group is None or "currency" not in group.group(1):
            problems.append(
                f"{where}: sums cost without grouping by currency "
                f"({match.group(0)}...): amounts in two currencies never add up"
            )
    for order in _ORDER_RE.finditer(sql):
        keys, limit_by = order.group(1), order.group(2)
        if "cost" not in keys:
            continue
        if not keys.strip().startswith("currency"):
            problems.append(
                f"{where}: ORDER BY {' '.join(keys.split())!r} ranks cost across currencies; "
                "order by currency first"
            )
        if "LIMIT" in order.group(0).upper() and "currency" not in (limit_by or ""):
            problems.append(f"{where}: a LIMIT on ranked cost must be LIMIT n BY currency")
    return problems


def lint_readability(title: str, panel: Mapping[str, Any]) -> list[str]:
    """A time series names the clock its axis shows, and a stack folds past its top N.

    Receive time and event time lie hours apart on replayed or late data: a panel plots
    one of them and says which in its title or description. A stack of more than a few
    series (tenants, models, tools, agents) keeps its largest and sums the rest as 'other'.
    """
    if panel.get("type") != "timeseries":
        return []
    sqls = [t.get("rawSql") or "" for t in panel.get("targets") or []]
    problems = []
    try:
        axis = time_axis(sqls)
    except DashboardError as exc:
        problems.append(f"{title}: {exc}")
        axis = None
    text = f"{panel.get('title', '')} {panel.get('description', '')}".lower()
    if axis and f"by {axis}" not in text:
        problems.append(
            f"{title}: plots by {axis} but its title and description do not say 'by {axis}'"
        )
    custom = panel.get("fieldConfig", {}).get("defaults", {}).get("custom", {})
    if custom.get("stacking", {}).get("mode", "none") == "none":
        return problems
    for sql in sqls:
        groups = _GROUP_RE.findall(sql)
        keys = {k.strip() for k in groups[-1].split(",")} if groups else set()
        open_ended = sorted(keys - _BOUNDED_SERIES)
        if open_ended and not all(part in sql for part in _TOP_FORM):
            problems.append(
                f"{title}: stacks one series per {', '.join(open_ended)} with no limit; "
                "keep the top N and sum the rest as 'other' (top_series)"
            )
    return problems


def _lint_sql(where: str, sql: str, probe_vars: list[Variable]) -> list[str]:
    """Expand with every variable set: macro misuse and leftovers show without a database."""
    try:
        return lint_expanded_sql(where, expand_query(sql, _PROBE, probe_vars))
    except MacroError as exc:
        return [f"{where}: {exc}"]


def _lint_panel(title: str, panel: Mapping[str, Any], variables: Mapping[str, Any]) -> list[str]:
    problems = []
    if panel.get("id") is None:
        problems.append(f"{title}: panel has no id")
    if not (panel.get("description") or "").strip():
        problems.append(f"{title}: panel has no description")
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
    if not unit:
        problems.append(f"{title}: panel has no unit (fieldConfig.defaults.unit)")
    ref = panel.get("datasource")
    if not (isinstance(ref, dict) and _is_var_ref(ref) and ref.get("type") == PLUGIN_ID):
        problems.append(f"{title}: panel datasource is {ref!r}, not the $datasource variable")
    targets = panel.get("targets") or []
    if not targets:
        problems.append(f"{title}: panel has no query")
    refs = Counter(t.get("refId") for t in targets)
    problems += [f"{title}: refId {r!r} is used {n} times" for r, n in refs.items() if n > 1]
    for target in targets:
        where = f"{title}/{target.get('refId')}"
        if not _is_var_ref(target.get("datasource")):
            problems.append(f"{where}: target datasource is {target.get('datasource')!r}")
        if target.get("editorType") != "sql" or not (target.get("rawSql") or "").strip():
            problems.append(f"{where}: needs editorType 'sql' and a rawSql")
        if target.get("format") not in (0, 1, 2, 3, 4):
            problems.append(f"{where}: format {target.get('format')!r} is not the plugin's")
        if panel.get("type") == "timeseries" and target.get("format") != 0:
            problems.append(f"{where}: a time-series panel needs format 0 (time series)")
        problems += unsafe_interpolations(where, target.get("rawSql") or "", variables)
        for match in _VAR_RE.finditer(target.get("rawSql") or ""):
            var = match.group(1) or match.group(2) or match.group(3)
            if var.startswith("__") or var in variables:
                continue
            problems.append(f"{where}: rawSql uses ${var}, which is not a dashboard variable")
    return problems


def unsafe_interpolations(where: str, sql: str, variables: Mapping[str, Any]) -> list[str]:
    """Dashboard variables interpolated into SQL in a form a value could break out of."""
    rest = _SAFE_REF_RE.sub("", sql)
    problems = []
    for match in _VAR_RE.finditer(rest):
        var = match.group(1) or match.group(2) or match.group(3)
        if var in variables and var != "datasource":
            problems.append(
                f"{where}: {match.group(0)} is interpolated unescaped (Grafana's singlequote "
                f"and sqlstring leave \\ alone); write decodeURLComponent('${{{var}:"
                "percentencode}') or pass it only as $__conditionalAll's variable"
            )
    return problems


def lint_expanded_sql(where: str, sql: str) -> list[str]:
    """An expanded query must carry no macro or variable Grafana would leave behind."""
    problems = []
    if "$__" in sql:
        problems.append(f"{where}: '$__' left after expansion: {sql[sql.index('$__') :][:60]!r}")
    left = [m.group(0) for m in _VAR_RE.finditer(sql) if not m.group(0).startswith("$__")]
    if left:
        problems.append(f"{where}: template variables left after expansion: {left}")
    return problems


def lint_alerting(files: Mapping[str, Mapping[str, Any]], datasource_uids: set[str]) -> list[str]:
    """Alert-rule, contact-point and policy files: refIds, datasources, macros, receivers."""
    problems: list[str] = []
    rules_uids: Counter[str] = Counter()
    receivers = {
        cp.get("name") for content in files.values() for cp in content.get("contactPoints", [])
    }
    for fname, content in files.items():
        if content.get("apiVersion") != 1:
            problems.append(f"{fname}: apiVersion must be 1, got {content.get('apiVersion')!r}")
        for group in content.get("groups", []):
            for key in ("orgId", "name", "folder", "interval", "rules"):
                if key not in group:
                    problems.append(f"{fname}: group {group.get('name')!r} has no {key!r}")
            for rule in group.get("rules", []):
                rules_uids[rule.get("uid")] += 1
                problems += _lint_rule(f"{fname}/{rule.get('uid')}", rule, datasource_uids)
        for cp in content.get("contactPoints", []):
            for receiver in cp.get("receivers", []):
                url = receiver.get("settings", {}).get("url", "")
                if receiver.get("type") == "webhook" and not str(url).startswith("$"):
                    problems.append(
                        f"{fname}: webhook {cp.get('name')!r} has a literal url {url!r}; take "
                        "it from an environment variable ($NAME)"
                    )
        for policy in content.get("policies", []):
            if policy.get("receiver") not in receivers:
                problems.append(
                    f"{fname}: policy receiver {policy.get('receiver')!r} is not a contact "
                    f"point ({sorted(r for r in receivers if r)})"
                )
    problems += [f"rule uid {u!r} is used {n} times" for u, n in rules_uids.items() if n > 1]
    return problems


def _lint_rule(where: str, rule: Mapping[str, Any], datasource_uids: set[str]) -> list[str]:
    problems = []
    for key in ("uid", "title", "condition", "data", "noDataState", "execErrState", "for"):
        if key not in rule:
            problems.append(f"{where}: no {key!r}")
    data = rule.get("data", [])
    ref_ids = [q.get("refId") for q in data]
    if len(set(ref_ids)) != len(ref_ids):
        problems.append(f"{where}: duplicate refIds {ref_ids}")
    if rule.get("condition") not in ref_ids:
        problems.append(f"{where}: condition {rule.get('condition')!r} is not a refId {ref_ids}")
    if rule.get("noDataState") not in ("OK", "NoData", "Alerting", "KeepLast"):
        problems.append(f"{where}: noDataState {rule.get('noDataState')!r}")
    if rule.get("execErrState") not in ("OK", "Error", "Alerting", "KeepLast"):
        problems.append(f"{where}: execErrState {rule.get('execErrState')!r}")
    if not _DURATION_RE.match(str(rule.get("for", ""))):
        problems.append(f"{where}: 'for' {rule.get('for')!r} is not a duration like 5m")
    annotations = rule.get("annotations") or {}
    for key in ("summary", "description", "runbook"):
        if not str(annotations.get(key) or "").strip():
            problems.append(f"{where}: no {key!r} annotation")
    runbook = str(annotations.get("runbook") or "")
    for part in _RUNBOOK_PARTS:
        if runbook and part not in runbook:
            problems.append(f"{where}: the runbook annotation has no {part!r} section")
    for key, value in (rule.get("labels") or {}).items():
        if "$" in f"{key}{value}":
            problems.append(f"{where}: label {key}={value!r} would be env-interpolated ('$')")
    for q in data:
        at = f"{where}/{q.get('refId')}"
        for key in ("refId", "relativeTimeRange", "datasourceUid", "model"):
            if key not in q:
                problems.append(f"{at}: no {key!r}")
        model = q.get("model") or {}
        if model.get("refId") != q.get("refId"):
            problems.append(f"{at}: model refId {model.get('refId')!r} differs")
        uid = q.get("datasourceUid")
        if uid == _EXPR_UID:
            for ref in re.findall(r"\$?\{?([A-Z][A-Za-z0-9_]*)\}?", model.get("expression", "")):
                if ref not in ref_ids:
                    problems.append(f"{at}: expression refers to {ref!r}, not a refId {ref_ids}")
            continue
        if uid not in datasource_uids:
            problems.append(
                f"{at}: datasourceUid {uid!r} is not provisioned {sorted(datasource_uids)}"
            )
        if (model.get("datasource") or {}).get("uid") != uid:
            problems.append(f"{at}: model datasource {model.get('datasource')!r} != {uid!r}")
        try:
            expanded = expand_alert_query(model.get("rawSql", ""), _PROBE)
        except MacroError as exc:
            problems.append(f"{at}: {exc}")
            continue
        problems += lint_expanded_sql(at, expanded)
    return problems
