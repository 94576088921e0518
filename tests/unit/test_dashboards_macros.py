"""The offline macro expander against the ClickHouse plugin's and Grafana's documented behaviour."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from prism.dashboards import ALL, MacroError, TimeRange, Variable, expand_alert_query, expand_query

# 2014-11-12 11:45:26.123 UTC .. 2014-11-12 12:45:26.456 UTC
FROM = datetime(2014, 11, 12, 11, 45, 26, 123_000, tzinfo=UTC)
TO = datetime(2014, 11, 12, 12, 45, 26, 456_000, tzinfo=UTC)
TR = TimeRange(FROM, TO, timedelta(seconds=30))
FROM_S, TO_S = 1415792726, 1415796326
FROM_MS, TO_MS = 1415792726123, 1415796326456

TENANT_FILTER = "$__conditionalAll(tenant_id IN (${tenant:singlequote}), $tenant)"


def test_time_filter_uses_whole_seconds() -> None:
    assert expand_query("WHERE $__timeFilter(ts)", TR) == (
        f"WHERE ts >= toDateTime({FROM_S}) AND ts <= toDateTime({TO_S})"
    )


def test_time_filter_ms_keeps_milliseconds() -> None:
    assert expand_query("WHERE $__timeFilter_ms(ts)", TR) == (
        f"WHERE ts >= fromUnixTimestamp64Milli({FROM_MS}) AND "
        f"ts <= fromUnixTimestamp64Milli({TO_MS})"
    )


def test_from_and_to_macros_without_arguments() -> None:
    sql = "$__fromTime, $__toTime, $__fromTime_ms, $__toTime_ms"
    assert expand_query(sql, TR) == (
        f"toDateTime({FROM_S}), toDateTime({TO_S}), fromUnixTimestamp64Milli({FROM_MS}), "
        f"fromUnixTimestamp64Milli({TO_MS})"
    )


def test_time_interval_and_interval_seconds_follow_the_panel_interval() -> None:
    assert expand_query("SELECT $__timeInterval(ts) AS t, count() / $__interval_s", TR) == (
        "SELECT toStartOfInterval(toDateTime(ts), INTERVAL 30 second) AS t, count() / 30"
    )
    tiny = TimeRange(FROM, TO, timedelta(milliseconds=200))
    assert expand_query("$__interval_s", tiny) == "1"
    assert expand_query("$__timeInterval_ms(ts)", tiny) == (
        "toStartOfInterval(toDateTime64(ts, 3), INTERVAL 200 millisecond)"
    )


def test_date_filters() -> None:
    assert expand_query("$__dateFilter(d)", TR) == (
        "d >= toDate('2014-11-12') AND d <= toDate('2014-11-12')"
    )
    assert expand_query("$__dt(d, t)", TR) == (
        "(d >= toDate('2014-11-12') AND d <= toDate('2014-11-12')) AND "
        f"(t >= toDateTime({FROM_S}) AND t <= toDateTime({TO_S}))"
    )


def test_macro_arguments_must_be_plain_columns() -> None:
    with pytest.raises(MacroError, match="plain column"):
        expand_query("WHERE $__timeFilter(toDateTime(ts))", TR)
    with pytest.raises(MacroError, match="expects 1 argument, received 2"):
        expand_query("WHERE $__timeFilter(a, b)", TR)
    with pytest.raises(MacroError, match="expects 1 argument"):
        expand_query("WHERE $__timeFilter", TR)


def test_unknown_macros_are_left_for_the_lint_to_catch() -> None:
    assert expand_query("SELECT $__unknown(x)", TR) == "SELECT $__unknown(x)"


def test_conditional_all_short_circuits_on_all_and_on_empty() -> None:
    sql = f"SELECT 1 WHERE {TENANT_FILTER}"
    everyone = Variable("tenant", [ALL], options=("acme", "globex"))
    assert expand_query(sql, TR, [everyone]) == "SELECT 1 WHERE 1=1"
    assert expand_query(sql, TR, [Variable("tenant", [])]) == "SELECT 1 WHERE 1=1"


def test_conditional_all_keeps_the_condition_for_a_selection() -> None:
    sql = f"SELECT 1 WHERE {TENANT_FILTER} AND x IN (SELECT y FROM t WHERE {TENANT_FILTER})"
    picked = Variable("tenant", ["acme", "o'neil"])
    assert expand_query(sql, TR, [picked]) == (
        "SELECT 1 WHERE tenant_id IN ('acme','o\\'neil') AND x IN "
        "(SELECT y FROM t WHERE tenant_id IN ('acme','o\\'neil'))"
    )


def test_conditional_all_needs_a_plain_variable_reference() -> None:
    tenant = Variable("tenant", [ALL])
    with pytest.raises(MacroError, match="names no variable"):
        expand_query("$__conditionalAll(a = 1, ${tenant})", TR, [tenant])
    with pytest.raises(MacroError, match="got 3 argument"):
        expand_query("$__conditionalAll(a = 1, b, $tenant)", TR, [tenant])
    with pytest.raises(MacroError, match="unbalanced"):
        expand_query("$__conditionalAll(a IN (1, $tenant)", TR, [tenant])


def test_all_expands_to_every_option_or_the_custom_all_value() -> None:
    everyone = Variable("tenant", [ALL], options=("acme", "globex"))
    assert expand_query("IN (${tenant:singlequote})", TR, [everyone]) == "IN ('acme','globex')"
    assert expand_query("IN ($tenant)", TR, [everyone]) == "IN ('acme','globex')"
    custom = Variable("tenant", [ALL], options=("acme",), all_value=".*")
    assert expand_query("match(t, '${tenant:singlequote}')", TR, [custom]) == "match(t, '.*')"


def test_variable_syntaxes_and_formats() -> None:
    run = Variable("run_id", "run-42")
    tenants = Variable("tenant", ["a", "b"])
    variables = [run, tenants]
    assert expand_query("$run_id ${run_id} [[run_id]]", TR, variables) == "run-42 run-42 run-42"
    assert expand_query("${run_id:singlequote}", TR, variables) == "'run-42'"
    assert expand_query("${tenant:csv}|${tenant:pipe}", TR, variables) == "a,b|a|b"
    assert expand_query("${tenant:doublequote}", TR, variables) == '"a","b"'
    assert expand_query("${tenant:sqlstring}", TR, [Variable("tenant", ["o'x"])]) == "'o''x'"
    # the plugin's own formatter: a list is quoted, a single value stays raw
    assert expand_query("$tenant / $run_id", TR, variables) == "'a','b' / run-42"
    with pytest.raises(MacroError, match="unsupported variable format 'lucene'"):
        expand_query("${tenant:lucene}", TR, variables)


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        ("run-42_a.b~c", "run-42_a.b~c"),
        ("\\' OR 1=1 -- ", "%5C%27%20OR%201%3D1%20--%20"),
        ("a'(b)*!", "a%27%28b%29%2A%21"),
        ("ü;%", "%C3%BC%3B%25"),
        (["a", "b,c"], "%7Ba%2Cb%2Cc%7D"),  # a list is written {a,b}, then encoded
    ],
)
def test_percentencode_is_grafanas_strict_uri_encoding(
    value: str | list[str], encoded: str
) -> None:
    assert expand_query("${v:percentencode}", TR, [Variable("v", value)]) == encoded


def test_grafanas_quote_formats_do_not_escape_backslashes() -> None:
    """Why the dashboards never use them: a trailing backslash ends the literal early."""
    hostile = Variable("v", "\\' OR 1=1 -- ")
    assert expand_query("${v:singlequote}", TR, [hostile]) == "'\\\\' OR 1=1 -- '"
    assert expand_query("${v:sqlstring}", TR, [hostile]) == "'\\'' OR 1=1 -- '"
    with pytest.raises(MacroError, match="not valid Unicode"):
        expand_query("${v:percentencode}", TR, [Variable("v", "\ud800")])


def test_unknown_variables_stay_and_builtins_expand() -> None:
    assert expand_query("$nope ${__from} ${__to} $__interval_ms", TR) == (
        f"$nope {FROM_MS} {TO_MS} 30000"
    )


def test_alert_queries_take_backend_macros_only() -> None:
    assert expand_alert_query("WHERE $__timeFilter(ts) AND x < $__interval_s", TR) == (
        f"WHERE ts >= toDateTime({FROM_S}) AND ts <= toDateTime({TO_S}) AND x < 30"
    )
    with pytest.raises(MacroError, match="does not expand when it evaluates alert rules"):
        expand_alert_query(f"WHERE {TENANT_FILTER}", TR)
    with pytest.raises(MacroError, match="'\\$run_id'"):
        expand_alert_query("WHERE run_id = '$run_id'", TR)


def test_time_range_must_be_aware_and_ordered() -> None:
    with pytest.raises(MacroError, match="no time zone"):
        TimeRange(datetime(2024, 1, 1), TO)
    with pytest.raises(MacroError, match="before it starts"):
        TimeRange(TO, FROM)
