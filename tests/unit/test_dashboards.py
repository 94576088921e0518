"""Dashboards and alert rules as code: the query type, the lint, the files Grafana loads."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from grafana_foundation_sdk.builders import timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder

from prism import dashboards
from prism.dashboards import (
    DASHBOARDS,
    DATASOURCE_UID,
    PLUGIN_ID,
    AlertThresholds,
    ClickHouseQuery,
    ClickHouseQueryBuilder,
    LintError,
    QueryFormat,
    alerting_files,
    build_all,
    dashboard_from_json,
    dashboard_json,
    default_out_dir,
    lint_alerting,
    lint_dashboard,
)
from prism.pipeline.cli import main
from prism.pipeline.commands.dashboards import alert_thresholds
from prism.pipeline.settings import load_settings

BUILT = {b.__name__: dashboard_json(b(None)) for b in DASHBOARDS}


def _panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dash["panels"] if p["type"] != "row"]


def test_exports_exist() -> None:
    missing = [name for name in dashboards.__all__ if not hasattr(dashboards, name)]
    assert not missing


def test_clickhouse_query_plugs_into_sdk_panel_builders() -> None:
    panel = (
        timeseries.Panel()
        .with_target(
            ClickHouseQueryBuilder("A").raw_sql("SELECT 1").format(QueryFormat.TIME_SERIES)
        )
        .build()
    )
    [target] = panel.targets or []
    assert isinstance(target, ClickHouseQuery)
    assert json.loads(json.dumps(target, cls=JSONEncoder)) == {
        "refId": "A",
        "editorType": "sql",
        "rawSql": "SELECT 1",
        "format": 0,
        "queryType": "timeseries",
        "datasource": {"type": PLUGIN_ID, "uid": "${datasource}"},
    }


def test_clickhouse_query_reads_back_from_json() -> None:
    data = {
        "refId": "B",
        "editorType": "sql",
        "rawSql": "SELECT 2",
        "format": 1,
        "queryType": "table",
        "datasource": {"type": PLUGIN_ID, "uid": "x"},
        "hide": True,
    }
    assert ClickHouseQuery.from_json(data).to_json()["hide"] is True
    assert json.loads(json.dumps(ClickHouseQuery.from_json(data), cls=JSONEncoder)) == data


@pytest.mark.parametrize("name", list(BUILT))
def test_dashboard_json_round_trips_through_the_sdk_model(name: str) -> None:
    data = BUILT[name]
    model = dashboard_from_json(copy.deepcopy(data))
    targets = [t for p in model.panels or [] for t in getattr(p, "targets", None) or []]
    assert targets and all(isinstance(t, ClickHouseQuery) for t in targets)
    assert dashboard_json(model) == data


@pytest.mark.parametrize("name", list(BUILT))
def test_generated_dashboards_pass_the_lint(name: str) -> None:
    assert lint_dashboard(BUILT[name]) == []


def test_dashboards_cover_what_each_audience_needs() -> None:
    titles = {name: {p["title"] for p in _panels(d)} for name, d in BUILT.items()}
    assert {
        "Events ingested per second",
        "Events emitted per second",
        "Runs by status",
        "Terminal latency (finished_at - started_at)",
        "Limit deaths by axis",
        "Failure classes",
        "Dead letters per minute by reason",
        "Quarantine per minute by reason",
        "Stale (incomplete) runs",
        "Ingest freshness",
    } <= titles["sre_overview"]
    assert {
        "Billable tokens by tenant and model",
        "Estimated share by confidence",
        "run_total mismatches",
    } <= titles["cost_and_usage"]
    assert {
        "Hit rate by provider / model",
        "Cache write tokens by provider / model",
        "Turns without cache reports by provider / model",
    } <= titles["cache_efficiency"]
    assert {
        "Runs",
        "Timeline",
        "Turns",
        "Tool calls",
        "Limit exhaustion (run and children)",
        "Delegated children",
    } <= titles["run_explorer"]
    assert {
        "Turn latency p50 by provider / model",
        "Turn latency p95 by provider / model",
        "Turn latency p99 by provider / model",
        "Provider error rate by provider / model",
        "Run failures by failure class",
        "Stop reasons",
        "Retried attempts share by provider / model",
    } <= titles["provider_health"]
    assert {
        "Cost by agent",
        "Cost by user",
        "Cost by session",
        "Top 20 most expensive runs",
        "Cost per successful run ($currency)",
        "Estimated share trend by tenant",
        "Budgets: spend vs amount per scope",
    } <= titles["cost_and_usage"]
    assert {
        "Tool calls by tool",
        "Tool error rate by tool",
        "Tool duration p95 by tool",
        "Tools summary",
        "Narrowing clamps by agent",
        "Tools dropped by narrowing",
    } <= titles["tools"]
    assert {
        "Ingest freshness",
        "Progress per source partition",
        "Dead letters by reason",
        "Quarantine by reason",
        "Alerts",
    } <= titles["pipeline"]
    cost_vars = [v["name"] for v in BUILT["cost_and_usage"]["templating"]["list"]]
    assert cost_vars == ["datasource", "tenant", "agent", "user", "session", "currency"]
    explorer_vars = [v["name"] for v in BUILT["run_explorer"]["templating"]["list"]]
    assert explorer_vars == ["datasource", "tenant", "run_id"]


@pytest.mark.parametrize("name", list(BUILT))
def test_every_tenant_scoped_panel_filters_by_tenant(name: str) -> None:
    """Every query on a view with tenant_id filters by the tenant variable, run explorer too."""
    for panel in _panels(BUILT[name]):
        for target in panel["targets"]:
            sql = target["rawSql"]
            if "FROM dead_letters" in sql or "FROM worker_progress" in sql:
                # no (trusted) tenant: SRE-only, stated in the panel
                assert "Not tenant-scoped" in panel["description"], panel["title"]
                continue
            assert "decodeURLComponent('${tenant:percentencode}')" in sql, panel["title"]
            assert "singlequote" not in sql and "sqlstring" not in sql


def _broken(mutate: Any) -> list[str]:
    dash = copy.deepcopy(BUILT["sre_overview"])
    mutate(dash)
    return lint_dashboard(dash)


def _first_panel(dash: dict[str, Any]) -> dict[str, Any]:
    return _panels(dash)[0]


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: d["templating"]["list"].pop(0), "needs a 'datasource' variable"),
        (lambda d: _first_panel(d).update(description=""), "has no description"),
        (lambda d: _first_panel(d)["fieldConfig"]["defaults"].pop("unit"), "has no unit"),
        (
            lambda d: _first_panel(d).update(
                datasource={"type": PLUGIN_ID, "uid": "prism-clickhouse"}
            ),
            "never a fixed uid",
        ),
        (
            lambda d: _first_panel(d)["targets"][0].update(datasource={"uid": "abc"}),
            "never a fixed uid",
        ),
        (lambda d: _panels(d)[1].update(id=_first_panel(d)["id"]), "is used 2 times"),
        (
            lambda d: _panels(d)[5]["targets"].append(dict(_panels(d)[5]["targets"][0])),
            "refId 'A' is used 2 times",
        ),
        (lambda d: d["templating"]["list"][1].update(refresh=1), "use 2 (on time range change)"),
        (lambda d: _panels(d)[4]["targets"][0].update(format=1), "needs format 0"),
        (
            lambda d: _first_panel(d)["targets"][0].update(rawSql="SELECT $nope"),
            "$nope, which is not a dashboard variable",
        ),
        (
            lambda d: _first_panel(d)["targets"][0].update(
                rawSql="SELECT 1 WHERE $__conditionalAll(tenant_id IN ($tenant), ${tenant})"
            ),
            "names no variable",
        ),
        (
            lambda d: _first_panel(d)["targets"][0].update(rawSql="WHERE $__timeFiltr(ts)"),
            "'$__' left after expansion",
        ),
        (
            lambda d: d["templating"]["list"][1].update(query="WHERE $__timeFilter(toDate(ts))"),
            "variable tenant: '$__timeFilter(toDate(ts)': ",
        ),
        (
            lambda d: d["templating"]["list"][1].update(allowCustomValue=True),
            "query variable 'tenant' allows custom values",
        ),
        (
            lambda d: _first_panel(d)["targets"][0].update(
                rawSql="SELECT 1 WHERE tenant_id IN (${tenant:singlequote})"
            ),
            "${tenant:singlequote} is interpolated unescaped",
        ),
        (
            lambda d: _first_panel(d)["targets"][0].update(
                rawSql="SELECT 1 WHERE tenant_id = '${tenant:percentencode}'"
            ),
            "${tenant:percentencode} is interpolated unescaped",
        ),
        (
            lambda d: _first_panel(d)["targets"][0].update(rawSql="SELECT 1 WHERE t = $tenant"),
            "$tenant is interpolated unescaped",
        ),
    ],
)
def test_lint_catches_each_broken_rule(mutate: Any, expected: str) -> None:
    problems = _broken(mutate)
    assert any(expected in p for p in problems), problems


def test_alert_files_pass_the_lint_and_use_the_provisioning_shape() -> None:
    files = alerting_files()
    assert lint_alerting(files, {DATASOURCE_UID}) == []
    [group] = files["alert-rules.yaml"]["groups"]
    assert {k: group[k] for k in ("orgId", "name", "folder", "interval")} == {
        "orgId": 1,
        "name": "prism-pipeline",
        "folder": "Prism",
        "interval": "60s",
    }
    assert {r["title"] for r in group["rules"]} == {
        "Run-limit exhaustion rate per axis",
        "Stale runs growing",
        "Dead-letter rate above baseline",
        "Ingest freshness",
        "Budget threshold crossed",  # dashboards/_budgets.py
        # channel rules (dashboards/_channels.py)
        "Channel open item unreconciled",
        "Channel capacity denials per connection",
        "Stuck channel operations",
    }
    retired = files["alert-rules.yaml"]["deleteRules"]
    assert {r["uid"] for r in retired} == {"prism-stale-runs", "prism-dead-letter-growth"}
    assert not {r["uid"] for r in retired} & {r["uid"] for r in group["rules"]}
    for rule in group["rules"]:
        assert set(rule) >= {
            "uid",
            "title",
            "condition",
            "data",
            "noDataState",
            "execErrState",
            "for",
            "annotations",
            "labels",
        }
        runbook = rule["annotations"]["runbook"]
        assert "Query to run:\nprism-pipeline query" in runbook or "curl" in runbook
        assert "folderUID" not in rule and "orgID" not in rule  # not the HTTP API shape
        assert rule["data"][0]["model"]["format"] == 1
    [cp] = files["contact-points.yaml"]["contactPoints"]
    assert cp["receivers"][0]["type"] == "webhook"
    assert cp["receivers"][0]["settings"]["url"] == "$PRISM_ALERT_WEBHOOK_URL"
    assert files["notification-policies.yaml"]["policies"][0]["receiver"] == cp["name"]


def _rule(files: dict[str, Any]) -> dict[str, Any]:
    rule: dict[str, Any] = files["alert-rules.yaml"]["groups"][0]["rules"][0]
    return rule


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda f: _rule(f).update(condition="Z"), "condition 'Z' is not a refId"),
        (lambda f: _rule(f)["data"].pop(1), "expression refers to 'B'"),
        (lambda f: _rule(f)["data"][0].update(datasourceUid="other"), "is not provisioned"),
        (
            lambda f: _rule(f)["data"][0]["model"].update(rawSql="SELECT 1 WHERE t IN ($tenant)"),
            "does not expand when it evaluates alert rules",
        ),
        (
            lambda f: _rule(f)["data"][0]["model"].update(rawSql="SELECT $__conditionalAll(1, $x)"),
            "does not expand",
        ),
        (
            lambda f: f["contact-points.yaml"]["contactPoints"][0]["receivers"][0][
                "settings"
            ].update(url="http://hooks.local"),
            "literal url",
        ),
        (
            lambda f: f["notification-policies.yaml"]["policies"][0].update(receiver="nobody"),
            "is not a contact point",
        ),
        (lambda f: _rule(f)["labels"].update(team="$TEAM"), "env-interpolated"),
        (lambda f: _rule(f)["annotations"].pop("runbook"), "no 'runbook' annotation"),
        (
            lambda f: _rule(f)["annotations"].update(runbook="What it means: x. What to do: y."),
            "runbook annotation has no 'Query to run:' section",
        ),
    ],
)
def test_alert_lint_catches_each_broken_rule(mutate: Any, expected: str) -> None:
    files = copy.deepcopy(alerting_files())
    mutate(files)
    problems = lint_alerting(files, {DATASOURCE_UID})
    assert any(expected in p for p in problems), problems


def _tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): p.read_text(encoding="utf-8")
        for sub in ("json", "provisioning")
        for p in sorted((root / sub).rglob("*"))
        if p.is_file()
    }


def test_build_writes_what_grafana_loads(tmp_path: Path) -> None:
    written = build_all(tmp_path)
    tree = _tree(tmp_path)
    assert sorted(tree) == sorted(str(p.relative_to(tmp_path)) for p in written)
    assert {k for k in tree if k.startswith("json/")} == {
        f"json/{d['uid']}.json" for d in BUILT.values()
    }
    ds = yaml.safe_load(tree["provisioning/datasources/prism-clickhouse.yaml"])["datasources"][0]
    assert (ds["uid"], ds["type"]) == (DATASOURCE_UID, PLUGIN_ID)
    assert ds["jsonData"]["host"] == "$CLICKHOUSE_HOST"
    assert (ds["jsonData"]["port"], ds["jsonData"]["protocol"]) == (9000, "native")
    assert ds["jsonData"]["defaultDatabase"] == "prism"
    provider = yaml.safe_load(tree["provisioning/dashboards/prism.yaml"])["providers"][0]
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"
    rules = yaml.safe_load(tree["provisioning/alerting/alert-rules.yaml"])
    assert (
        lint_alerting(
            {
                "alert-rules.yaml": rules,
                "contact-points.yaml": yaml.safe_load(
                    tree["provisioning/alerting/contact-points.yaml"]
                ),
                "notification-policies.yaml": yaml.safe_load(
                    tree["provisioning/alerting/notification-policies.yaml"]
                ),
            },
            {DATASOURCE_UID},
        )
        == []
    )
    for name, text in tree.items():
        if name.startswith("json/"):
            assert lint_dashboard(json.loads(text)) == []


def test_build_refuses_to_write_a_dashboard_that_breaks_the_lint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(database: str | None = None) -> Any:
        model = dashboards.sre_overview(database)
        model.panels[1].description = ""  # type: ignore[index, union-attr]
        return model

    monkeypatch.setattr("prism.dashboards._provisioning.DASHBOARDS", (broken,))
    with pytest.raises(LintError, match="has no description"):
        build_all(tmp_path)
    assert not any(tmp_path.iterdir())


def test_committed_files_are_up_to_date(tmp_path: Path) -> None:
    build_all(tmp_path)
    assert _tree(default_out_dir()) == _tree(tmp_path), (
        "dashboards/json or dashboards/provisioning differ from the builders; run "
        "`prism-pipeline dashboards build` and commit the result"
    )


def test_cli_builds_into_the_given_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["dashboards", "build", "--out", str(tmp_path)]) == 0
    # one JSON per dashboard, the datasource, the dashboard provider and 3 alerting files
    assert f"wrote {len(DASHBOARDS) + 5} files" in capsys.readouterr().out
    assert (tmp_path / "provisioning" / "alerting" / "alert-rules.yaml").is_file()


def test_alert_thresholds_default_to_the_settings_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """The committed rules (AlertThresholds()) are what `dashboards build` writes by default."""
    for name in list(os.environ):
        if name.startswith("PRISM_"):
            monkeypatch.delenv(name)
    assert alert_thresholds(load_settings()) == AlertThresholds()


def test_cli_takes_alert_thresholds_from_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PRISM_ALERT_FRESHNESS_SECONDS", "120")
    monkeypatch.setenv("PRISM_ALERT_DEAD_LETTER_WINDOW_SECONDS", "600")
    assert main(["dashboards", "build", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "provisioning" / "alerting" / "alert-rules.yaml").read_text()
    rules = {r["uid"]: r for r in yaml.safe_load(text)["groups"][0]["rules"]}
    fresh = rules["prism-ingest-freshness"]["data"][2]["model"]["conditions"][0]
    assert fresh["evaluator"]["params"] == [120.0]
    dead = rules["prism-dead-letter-rate"]["data"][0]
    assert "INTERVAL 600 SECOND" in dead["model"]["rawSql"]
    assert dead["relativeTimeRange"]["from"] == 600 + 86_400
    monkeypatch.setenv("PRISM_ALERT_STALE_FACTOR", "0.5")
    capsys.readouterr()
    assert main(["dashboards", "build", "--out", str(tmp_path)]) == 2
    assert "PRISM_ALERT_STALE_FACTOR='0.5'" in capsys.readouterr().err
