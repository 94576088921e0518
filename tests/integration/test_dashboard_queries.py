"""Every dashboard, variable and alert query, expanded as Grafana would, runs on a real ledger.

The ledger is a chDB database filled the way production fills it: the fleet simulator's
records (with duplicates, reordering, junk and post-terminal noise) replayed through
``pipeline.ingest`` into ``sinks.LedgerWriter``. Panel figures are checked against the
simulator's ground-truth manifest.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest

from prism.dashboards import (
    ALL,
    DASHBOARDS,
    TOP_SERIES,
    TimeRange,
    Variable,
    alert_rules,
    cache_efficiency,
    cost_and_usage,
    dashboard_json,
    expand_alert_query,
    expand_query,
    lint_expanded_sql,
    pipeline,
    provider_health,
    run_explorer,
    sre_overview,
    tools,
)
from prism.pipeline._store import LedgerStore
from prism.pipeline.core import Output
from prism.pipeline.ingest import ingest_lines
from prism.runtime.simulator import Fleet, FleetConfig, simulate
from prism.schemas import LedgerBatch, ProgressRow
from prism.sinks import LedgerWriter, migrate
from tests.fixtures import budgets

pytestmark = pytest.mark.integration

FLEET = FleetConfig(
    runs=300,
    seed=11,
    duplicates=0.02,
    reorder_window=3,
    post_terminal=0.05,
    conflicting_terminals=0.03,
    malformed=0.03,
    oversized=0.01,
    channel_operations=400,  # the Channels dashboard and its rules (a stuck op per tenant)
    guardrail_denials=0.05,
)


@dataclass
class Ledger:
    client: Any
    database: str
    fleet: Fleet
    time_range: TimeRange
    run_id: str  # a run with tool calls and a delegated child that died on a limit
    run_tenant: str

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        return list(self.client.query(sql).result_rows)


@pytest.fixture(scope="module")
def ledger(ch_client: Any) -> Iterator[Ledger]:
    database = f"t_dash_{uuid.uuid4().hex[:10]}"
    ch_client.command(f"CREATE DATABASE {database}")
    try:
        # The simulated fleet lives at a fixed event time; keep its raw events well inside
        # their retention whatever the machine's date.
        migrate(ch_client, database, raw_event_ttl_days=3650)
        fleet = simulate(FLEET)
        start = FLEET.resolved_start
        ingest_lines(
            (record.value for record in fleet.records),
            source="file:fleet.jsonl",
            store=LedgerStore(LedgerWriter(ch_client, database)),
            clock=lambda: (start + timedelta(hours=3, minutes=15)).timestamp(),
            max_event_bytes=FLEET.max_event_bytes,
        )
        _sample_progress(LedgerStore(LedgerWriter(ch_client, database)), start)
        found = ch_client.query(
            f"""
            SELECT p.run_id, p.tenant_id
            FROM {database}.runs AS p INNER JOIN {database}.runs AS c ON c.parent_run_id = p.run_id
            WHERE c.exhaustion_limit IS NOT NULL AND p.tool_calls > 0
            ORDER BY p.run_id LIMIT 1
            """
        ).result_rows
        assert found, "the simulated fleet has no parent run whose child died on a limit"
        budgets.store_crossing(ch_client, database, found[0][1], start)
        yield Ledger(
            client=ch_client,
            database=database,
            fleet=fleet,
            time_range=TimeRange(
                start - timedelta(minutes=30), start + timedelta(hours=4), timedelta(minutes=5)
            ),
            run_id=found[0][0],
            run_tenant=found[0][1],
        )
    finally:
        ch_client.command(f"DROP DATABASE IF EXISTS {database} SYNC")


# Two workers' position samples (worker_progress), as the worker writes them every
# PRISM_PROGRESS_INTERVAL_SECONDS: w-a holds partitions 0 and 1, w-b partition 2, whose lag
# grows to 900 while the others catch up. The lag panels must show exactly these.
_PROGRESS_LAGS = {("w-a", 0): (40, 10, 0), ("w-a", 1): (5, 0, 0), ("w-b", 2): (100, 500, 900)}


def _sample_progress(store: LedgerStore, start: datetime) -> None:
    rows = []
    for (worker, partition), lags in _PROGRESS_LAGS.items():
        for i, lag in enumerate(lags):
            ts = start + timedelta(hours=1, minutes=5 * i)
            end = 1000 * (partition + 1) + 100 * i
            rows.append(ProgressRow(ts, worker, "t.prism.agent-events", partition,
                                    end - lag, end, lag, ts - timedelta(seconds=2)))  # fmt: skip
    out = Output(ledger=LedgerBatch(progress=rows))
    out.ranges.append(("progress", 0, 0, 0))
    store(out)


def _variables(ledger: Ledger, dash: dict[str, Any], tenant: str) -> list[Variable]:
    """The variables as Grafana would hold them: tenant options come from the tenant query."""
    tenant_sql = next(v for v in dash["templating"]["list"] if v["name"] == "tenant")["query"]
    options = [r[0] for r in ledger.rows(expand_query(tenant_sql, ledger.time_range, []))]
    value = [ALL] if tenant == ALL else [tenant]
    variables = [
        Variable("tenant", value, options=options),
        Variable("run_id", ledger.run_id),
        Variable("datasource", "prism-clickhouse"),
    ]
    # Every other filter (provider, tool, agent, user, session) on All, options from its query.
    for var in dash["templating"]["list"]:
        if var["type"] == "query" and var["name"] not in ("tenant", "run_id"):
            sql = expand_query(var["query"], ledger.time_range, variables)
            variables.append(Variable(var["name"], [ALL], options=[r[0] for r in ledger.rows(sql)]))
    return variables


def _queries(dash: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            yield f"{dash['uid']}/variable {var['name']}", var["query"]
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            yield f"{dash['uid']}/{panel['title']}/{target['refId']}", target["rawSql"]


@pytest.mark.parametrize("tenant", [ALL, "run's tenant"])
@pytest.mark.parametrize("build", DASHBOARDS, ids=[b.__name__ for b in DASHBOARDS])
def test_every_query_of_every_dashboard_returns_rows(
    ledger: Ledger, build: Any, tenant: str
) -> None:
    dash = dashboard_json(build(ledger.database))
    selected = ledger.run_tenant if tenant != ALL else ALL
    variables = _variables(ledger, dash, selected)
    empty, problems = [], []
    for where, sql in _queries(dash):
        expanded = expand_query(sql, ledger.time_range, variables)
        problems += lint_expanded_sql(where, expanded)
        if not ledger.rows(expanded):
            empty.append(where)
    assert not problems
    assert not empty, f"queries returning no rows with tenant={selected}: {empty}"


def test_alert_queries_return_rows(ledger: Ledger) -> None:
    """Each rule's query runs; whether it fires is tests/integration/test_alert_rules.py's."""
    values = {}
    for rule in alert_rules(database=ledger.database):
        model = rule.data[0].model
        rows = ledger.rows(expand_alert_query(model.raw_sql, ledger.time_range))  # type: ignore[union-attr]
        assert rows, f"alert {rule.title!r} returned no rows"
        values[rule.uid] = rows
    manifest = ledger.fleet.manifest
    died_on = {r["exhaustion"]["axis"] for r in manifest["runs"].values() if r["exhaustion"]}
    assert {axis for axis, _ in values["prism-limit-exhaustion-rate"]} == died_on


def _value(ledger: Ledger, dash: dict[str, Any], title: str, tenant: str) -> Any:
    panel = next(p for p in dash["panels"] if p.get("title") == title)
    sql = expand_query(
        panel["targets"][0]["rawSql"], ledger.time_range, _variables(ledger, dash, tenant)
    )
    return ledger.rows(sql)


def test_sre_figures_match_the_ground_truth(ledger: Ledger) -> None:
    manifest = ledger.fleet.manifest
    dash = dashboard_json(sre_overview(ledger.database))
    incomplete = sum(1 for r in manifest["runs"].values() if r["status"] == "incomplete")
    assert _value(ledger, dash, "Dead letters (range)", ALL) == [(sum(manifest["dlq"].values()),)]
    assert _value(ledger, dash, "Quarantined events (range)", ALL) == [
        (sum(manifest["quarantine"].values()),)
    ]
    assert _value(ledger, dash, "Stale (incomplete) runs", ALL) == [(incomplete,)]
    tenant_options = _variables(ledger, dash, ALL)[0].options
    assert sorted(tenant_options) == sorted(manifest["tenants"])


def test_billing_figures_match_the_ground_truth_per_tenant(ledger: Ledger) -> None:
    dash = dashboard_json(cost_and_usage(ledger.database))
    for tenant, truth in ledger.fleet.manifest["tenants"].items():
        billable = truth["billable"]["total_tokens"]
        estimated = truth["estimated"]["total_tokens"]
        assert _value(ledger, dash, "Billable tokens", tenant) == [(billable,)], tenant
        [(share,)] = _value(ledger, dash, "Estimated share of provider-turn tokens", tenant)
        assert share == pytest.approx(estimated / (billable + estimated)), tenant


def test_cache_hit_rate_is_token_weighted_over_turns_reporting_cache(ledger: Ledger) -> None:
    dash = dashboard_json(cache_efficiency(ledger.database))
    for tenant in ledger.fleet.manifest["tenants"]:
        [(expected,)] = ledger.rows(
            f"""
            SELECT sum(cache_read_tokens) / sum(input_tokens)
            FROM {ledger.database}.turns
            WHERE kind = 'model' AND tenant_id = '{tenant}'
              AND cache_read_tokens IS NOT NULL AND input_tokens IS NOT NULL
            """
        )
        [(hit_rate,)] = _value(ledger, dash, "Cache hit rate", tenant)
        assert hit_rate == pytest.approx(expected), tenant


def test_run_explorer_follows_the_selected_run(ledger: Ledger) -> None:
    dash = dashboard_json(run_explorer(ledger.database))
    [(event_count,)] = ledger.rows(
        f"SELECT event_count FROM {ledger.database}.runs WHERE run_id = '{ledger.run_id}'"
    )
    timeline = _value(ledger, dash, "Timeline", ALL)
    assert [row[0] for row in timeline] == sorted(row[0] for row in timeline)
    assert len(timeline) == event_count
    children = [
        run_id
        for run_id, r in ledger.fleet.manifest["runs"].items()
        if r["parent_run_id"] == ledger.run_id
    ]
    assert sorted(r[0] for r in _value(ledger, dash, "Delegated children", ALL)) == sorted(children)
    exhaustion = _value(ledger, dash, "Limit exhaustion (run and children)", ALL)
    assert {r[0] for r in exhaustion} <= {ledger.run_id, *children} and exhaustion


def _narrowed(ledger: Ledger, dash: dict[str, Any], title: str, **chosen: str) -> Any:
    """A panel's rows with some filters (e.g. tool, agent) set to one value, the rest on All."""
    variables = {
        v.name: Variable(v.name, [chosen[v.name]]) if v.name in chosen else v
        for v in _variables(ledger, dash, ALL)
    }
    panel = next(p for p in dash["panels"] if p.get("title") == title)
    return ledger.rows(expand_query(panel["targets"][0]["rawSql"], ledger.time_range, variables))


def test_provider_and_tool_figures_match_the_ledger(ledger: Ledger) -> None:
    db = ledger.database
    provider = dashboard_json(provider_health(db))
    [(retried, attempts)] = ledger.rows(
        f"SELECT countIf(attempt > 1), count() FROM {db}.turns WHERE kind = 'model'"
    )
    assert retried > 0
    assert _value(ledger, provider, "Retried attempts", ALL) == [
        (pytest.approx(retried / attempts),)
    ]
    board = dashboard_json(tools(db))
    [(calls, clamps)] = ledger.rows(
        f"SELECT countIf(type = 'tool_call_finished'), countIf(type = 'tool_narrowing_clamped') "
        f"FROM {db}.run_events"
    )
    assert _value(ledger, board, "Tool calls", ALL) == [(calls,)]
    assert _value(ledger, board, "Narrowing clamps", ALL) == [(clamps,)] and clamps > 0
    [(tool, tool_calls)] = ledger.rows(
        f"SELECT JSONExtractString(payload, 'tool') AS t, count() FROM {db}.run_events "
        "WHERE type = 'tool_call_finished' GROUP BY t ORDER BY count() DESC, t LIMIT 1"
    )
    summary = _narrowed(ledger, board, "Tools summary", tool=tool)
    assert [(row[0], row[1]) for row in summary] == [(tool, tool_calls)]


def test_cost_by_run_and_agent_match_the_ledger(ledger: Ledger) -> None:
    """Runs and agents are ranked by cost within their currency, never across currencies."""
    db = ledger.database
    dash = dashboard_json(cost_and_usage(db))
    tops = ledger.rows(
        f"SELECT currency, argMax(run_id, c), max(c), count() FROM ("
        f"  SELECT run_id, currency, toFloat64(sum(cost)) AS c FROM {db}.billing_usage "
        "   WHERE NOT superseded AND cost IS NOT NULL GROUP BY run_id, currency"
        ") GROUP BY currency ORDER BY currency"
    )
    assert len(tops) >= 2, "the fleet prices usage in more than one currency"
    top = _value(ledger, dash, "Top 20 most expensive runs", ALL)
    assert [r[6] for r in top] == sorted(r[6] for r in top)  # one block per currency
    for currency, run, cost, runs in tops:
        rows = [r for r in top if r[6] == currency]
        assert len(rows) == min(20, runs)
        assert (rows[0][0], rows[0][7]) == (run, pytest.approx(cost))
        assert [r[7] for r in rows] == sorted((r[7] for r in rows), reverse=True)
    currency, top_run = tops[0][0], tops[0][1]
    [(agent,)] = ledger.rows(f"SELECT agent_id FROM {db}.runs WHERE run_id = '{top_run}'")
    by_agent = _narrowed(ledger, dash, "Cost by agent", agent=agent)
    assert {row[0] for row in by_agent} == {agent}
    [(agent_cost,)] = ledger.rows(
        f"SELECT toFloat64(sum(u.cost)) FROM {db}.billing_usage AS u "
        f"INNER JOIN {db}.runs AS r ON r.run_id = u.run_id "
        f"WHERE NOT u.superseded AND r.agent_id = '{agent}' AND u.currency = '{currency}'"
    )
    assert sum(row[5] or 0 for row in by_agent if row[1] == currency) == pytest.approx(agent_cost)


def test_pipeline_alerts_table_lists_each_alert_once(ledger: Ledger) -> None:
    dash = dashboard_json(pipeline(ledger.database))
    [(alerts,)] = ledger.rows(f"SELECT uniq(alert_id) FROM {ledger.database}.alerts")
    rows = _value(ledger, dash, "Alerts", ALL)
    assert len(rows) == alerts > 0
    assert {r[3] for r in rows} <= {"firing", "resolved"} and all(r[6] >= 0 for r in rows)


def test_pipeline_lag_panels_show_the_workers_samples(ledger: Ledger) -> None:
    dash = dashboard_json(pipeline(ledger.database))
    series = _value(ledger, dash, "Consumer lag by source partition", ALL)
    peak: dict[str, int] = {}
    for _, partition, lag in series:
        peak[partition] = max(peak.get(partition, 0), lag)
    assert peak == {f"t.prism.agent-events[{p}]": max(lags)
                    for (_, p), lags in _PROGRESS_LAGS.items()}  # fmt: skip
    table = _value(ledger, dash, "Workers and their partitions", ALL)
    latest = {(r[0], r[2]): (r[3], r[4], r[5]) for r in table}
    assert latest == {
        (w, p): (1000 * (p + 1) + 200 - lags[-1], 1000 * (p + 1) + 200, lags[-1])
        for (w, p), lags in _PROGRESS_LAGS.items()
    }
    assert all(r[6] >= 0 and r[7] >= r[6] for r in table)  # sampled, then the batch before


# -- the Channels dashboard and its alert rules (dashboards/_channels.py) ---------------------
def test_channel_panels_match_the_ground_truth(ledger: Ledger) -> None:
    from collections import Counter

    from prism.dashboards import channels

    truth = ledger.fleet.manifest["channels"]
    dash = dashboard_json(channels(ledger.database))
    opens = truth["open_items"]
    assert _value(ledger, dash, "Open items", ALL) == [(len(opens),)]
    assert _value(ledger, dash, "Oldest open item", ALL) == [
        (max(o["age_seconds"] for o in opens),)
    ]
    assert _value(ledger, dash, "Stuck operations", ALL) == [(len(truth["stuck"]),)]
    assert _value(ledger, dash, "Capacity denials (range)", ALL) == [
        (truth["denials"]["by_reason"]["capacity"],)
    ]
    by_state = dict(_value(ledger, dash, "Operations by state", ALL))
    operations = Counter(op["state"] for op in truth["operations"].values())
    assert by_state == {state or "(none)": n for state, n in operations.items()}
    quarantined = dict(_value(ledger, dash, "Quarantined channel records by reason", ALL))
    assert quarantined == {k: v for k, v in truth["quarantine"].items() if v}
    by_connection = dict(_value(ledger, dash, "Denials by connection", ALL))
    assert by_connection == {
        c: sum(r.values()) for c, r in truth["denials"]["by_connection"].items()
    }
    rules: Counter[str] = Counter()
    for rule_stage, n in _value(ledger, dash, "Guardrail denials by rule", ALL):
        rules[rule_stage.split(" (")[0]] += n
    assert dict(rules) == ledger.fleet.manifest["guardrails"]["by_rule"] != {}
    tenant = "umbrella-eu"
    table = _value(ledger, dash, "Open items with age", tenant)
    assert (
        sorted((r[0], r[5]) for r in table)
        == sorted((o["operation_id"], o["age_seconds"]) for o in opens if o["tenant_id"] == tenant)
        != []
    )
    stuck = [r[0] for r in _value(ledger, dash, "Stuck operations, longest first", tenant)]
    assert sorted(stuck) == [
        s for s in truth["stuck"] if truth["operations"][s]["tenant_id"] == tenant
    ]


def test_channel_alert_rules_match_the_ground_truth(ledger: Ledger) -> None:
    from prism.dashboards import ChannelThresholds

    truth = ledger.fleet.manifest["channels"]
    values = {}
    for rule in alert_rules(database=ledger.database, channel=ChannelThresholds(60, 0.01)):
        if rule.uid.startswith("prism-channel-"):
            model = rule.data[0].model
            sql = expand_alert_query(model.raw_sql, ledger.time_range)  # type: ignore[union-attr]
            values[rule.uid] = ledger.rows(sql)
    old = [o for o in truth["open_items"] if o["age_seconds"] > 3600]
    assert values["prism-channel-open-items"] == [(len(old),)] != [(0,)]
    assert values["prism-channel-stuck-operations"] == [(len(truth["stuck"]),)]
    capacity = {
        c: r["capacity"] for c, r in truth["denials"]["by_connection"].items() if "capacity" in r
    }
    # expanded over the test range every denial counts; the rule divides by its window
    minutes = ChannelThresholds().capacity_window_s / 60
    got = {c: round(rate * minutes) for c, rate in values["prism-channel-capacity-denials"]}
    assert got == capacity


def test_no_stacked_panel_draws_more_series_than_a_reader_can_tell_apart(ledger: Ledger) -> None:
    """On the fleet (more tenant / model pairs than that), stacks keep their top 8 + 'other'."""
    db = ledger.database
    [(pairs,)] = ledger.rows(
        f"SELECT uniq(tenant_id, model) FROM {db}.billing_usage WHERE NOT estimated"
    )
    assert pairs > TOP_SERIES + 1, "the fleet no longer has enough pairs for this test"
    for build in DASHBOARDS:
        dash = dashboard_json(build(db))
        variables = _variables(ledger, dash, ALL)
        for panel in dash["panels"]:
            custom = panel.get("fieldConfig", {}).get("defaults", {}).get("custom", {})
            if custom.get("stacking", {}).get("mode", "none") == "none":
                continue
            for target in panel["targets"]:
                rows = ledger.rows(expand_query(target["rawSql"], ledger.time_range, variables))
                labels = {r[1] for r in rows if len(r) > 2 and isinstance(r[1], str)}
                width = len(rows[0]) - 1 if rows else 0
                assert max(len(labels), width) <= TOP_SERIES + 1, (panel["title"], labels)
    tokens = _value(
        ledger, dashboard_json(cost_and_usage(db)), "Billable tokens by tenant and model", ALL
    )
    assert len({r[1] for r in tokens}) == TOP_SERIES + 1 and "other" in {r[1] for r in tokens}
