"""The tools dashboard: calls, errors and duration per tool, and tool-narrowing clamps.

Tool figures come from the raw event log (``run_events``, kept ``PRISM_RAW_EVENT_TTL_DAYS``):
``tool_call_finished`` (tool, ok, errorCode, durationMs) and ``tool_narrowing_clamped``
(the tool names dropped from a turn's menu). Tool arguments and results never reach the
pipeline, so none is shown.
"""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dashboard_models

from prism.dashboards._panels import (
    TENANT_FILTER,
    TOP_SERIES,
    Board,
    bars,
    ch,
    query_variable,
    selected,
    stat_panel,
    table_panel,
    timeseries_panel,
    top_series,
)

__all__ = ["UID", "tools"]

UID = "prism-tools"

# One tool call per row: tool, ok, error code, duration, of the chosen tenants and tools.
_CALLS = f"""(
    SELECT ts, tenant_id, agent_id,
           JSONExtractString(payload, 'tool') AS tool,
           JSONExtractBool(payload, 'ok') AS ok,
           JSONExtractString(payload, 'errorCode') AS error_code,
           JSONExtractFloat(payload, 'durationMs') AS duration_ms
    FROM run_events
    WHERE type = 'tool_call_finished' AND $__timeFilter(ts) AND {TENANT_FILTER}
)"""
TOOL_FILTER = f"$__conditionalAll({selected('tool', 'tool')}, $tool)"
# One dropped tool per row of each clamp.
_DROPPED = f"""(
    SELECT ts, run_id, agent_id, tenant_id,
           arrayJoin(JSONExtract(payload, 'dropped', 'Array(String)')) AS tool
    FROM run_events
    WHERE type = 'tool_narrowing_clamped' AND $__timeFilter(ts) AND {TENANT_FILTER}
)"""


def tools(database: str | None = None) -> dashboard_models.Dashboard:
    """Calls, error rate and duration per tool; which tools narrowing dropped.

    Example::

        model = tools()
    """
    b = Board(
        UID,
        "Prism / Tools",
        "Tool calls of the agents: calls, error rate and duration p95 per tool, error "
        "codes, and tool-narrowing clamps (tools dropped from a turn's menu).",
        database=database,
        tags=("prism", "tools"),
    )
    b.variable(
        query_variable(
            "tool",
            "Tool",
            f"""
            SELECT DISTINCT JSONExtractString(payload, 'tool') AS tool FROM run_events
            WHERE type = 'tool_call_finished' AND $__timeFilter(ts) AND {TENANT_FILTER}
            ORDER BY tool
            """,
            "Tools called in the time range (All = every tool)",
            include_all=True,
            multi=True,
        )
    )
    b.add(
        stat_panel(
            "Tool calls",
            "tool_call_finished events of the chosen tools in the time range.",
            "short",
            ch(f"SELECT count() AS calls FROM {_CALLS} WHERE {TOOL_FILTER}"),
        ),
        stat_panel(
            "Tool error rate",
            "Share of the chosen tools' calls that finished with ok = false.",
            "percentunit",
            ch(
                f"SELECT countIf(NOT ok) / nullIf(count(), 0) AS error_rate FROM {_CALLS} "
                f"WHERE {TOOL_FILTER}"
            ),
            thresholds=((None, "green"), (0.05, "orange"), (0.2, "red")),
            decimals=2,
        ),
        stat_panel(
            "Tool duration p95",
            "95th percentile of durationMs over the chosen tools' calls.",
            "ms",
            ch(f"SELECT quantile(0.95)(duration_ms) AS p95 FROM {_CALLS} WHERE {TOOL_FILTER}"),
            decimals=0,
        ),
        stat_panel(
            "Narrowing clamps",
            "tool_narrowing_clamped events in the time range: turns whose tool menu was cut "
            "(the agent could not offer every tool it has).",
            "short",
            ch(
                f"""
                SELECT count() AS clamps
                FROM run_events
                WHERE type = 'tool_narrowing_clamped' AND $__timeFilter(ts) AND {TENANT_FILTER}
                """
            ),
            thresholds=((None, "green"), (1, "orange")),
        ),
    )
    b.add(
        timeseries_panel(
            "Tool calls by tool",
            f"Calls per interval of each chosen tool, placed at the call's finish time: the "
            f"{TOP_SERIES} most called over the range, the rest summed as 'other'.",
            "short",
            [
                ch(
                    top_series(
                        f"""
                        SELECT $__timeInterval(ts) AS time, tool AS series, count() AS value
                        FROM {_CALLS}
                        WHERE {TOOL_FILTER}
                        GROUP BY time, series
                        """,
                        "calls",
                    )
                )
            ],
            stacked=True,
            bars_style=True,
            w=8,
        ),
        timeseries_panel(
            "Tool error rate by tool",
            "Share of each interval's calls that failed (ok = false), per tool.",
            "percentunit",
            [
                ch(
                    f"""
                    SELECT $__timeInterval(ts) AS time, tool, countIf(NOT ok) / count() AS errors
                    FROM {_CALLS}
                    WHERE {TOOL_FILTER}
                    GROUP BY time, tool
                    ORDER BY time, tool
                    """
                )
            ],
            w=8,
        ),
        timeseries_panel(
            "Tool duration p95 by tool",
            "95th percentile of each interval's call durations, per tool.",
            "ms",
            [
                ch(
                    f"""
                    SELECT $__timeInterval(ts) AS time, tool, quantile(0.95)(duration_ms) AS p95
                    FROM {_CALLS}
                    WHERE {TOOL_FILTER}
                    GROUP BY time, tool
                    ORDER BY time, tool
                    """
                )
            ],
            w=8,
        ),
    )
    b.add(
        table_panel(
            "Tools summary",
            "Per tool over the time range: calls, failures, error rate, duration p50/p95/p99, "
            "the most frequent error code, and how many agents called it.",
            "short",
            ch(
                f"""
                SELECT tool, count() AS calls, countIf(NOT ok) AS failures,
                       countIf(NOT ok) / count() AS error_rate,
                       quantile(0.5)(duration_ms) AS p50_ms,
                       quantile(0.95)(duration_ms) AS p95_ms,
                       quantile(0.99)(duration_ms) AS p99_ms,
                       topKIf(1)(error_code, NOT ok AND error_code != '') AS top_error,
                       uniq(agent_id) AS agents
                FROM {_CALLS}
                WHERE {TOOL_FILTER}
                GROUP BY tool
                ORDER BY calls DESC
                """
            ),
            w=16,
            field_units={
                "error_rate": "percentunit",
                "p50_ms": "ms",
                "p95_ms": "ms",
                "p99_ms": "ms",
            },
        ),
        bars(
            "Error codes",
            "Failed calls of the chosen tools in the time range by tool and errorCode "
            "('none' when the runtime gave no code).",
            "short",
            ch(
                f"""
                SELECT concat(tool, ': ', if(error_code = '', 'none', error_code)) AS failure,
                       count() AS calls
                FROM {_CALLS}
                WHERE NOT ok AND {TOOL_FILTER}
                GROUP BY failure
                ORDER BY calls DESC
                LIMIT 20
                """
            ),
            w=8,
            h=9,
        ),
    )
    b.row("Tool narrowing")
    b.add(
        timeseries_panel(
            "Narrowing clamps by agent",
            f"tool_narrowing_clamped events per interval by agent: turns whose tool menu was "
            f"cut down to fit; the {TOP_SERIES} agents with the most, the rest summed as 'other'.",
            "short",
            [
                ch(
                    top_series(
                        f"""
                        SELECT $__timeInterval(ts) AS time, ifNull(agent_id, '?') AS series,
                               count() AS value
                        FROM run_events
                        WHERE type = 'tool_narrowing_clamped' AND $__timeFilter(ts)
                          AND {TENANT_FILTER}
                        GROUP BY time, series
                        """,
                        "clamps",
                    )
                )
            ],
            stacked=True,
            bars_style=True,
        ),
        table_panel(
            "Tools dropped by narrowing",
            "How often each tool was dropped from a turn's menu in the time range, in how "
            "many runs, and by which agents.",
            "short",
            ch(
                f"""
                SELECT tool, count() AS dropped, uniq(run_id) AS runs,
                       arrayStringConcat(arraySort(groupUniqArray(ifNull(agent_id, '?'))), ', ')
                           AS agents
                FROM {_DROPPED}
                GROUP BY tool
                ORDER BY dropped DESC
                """
            ),
            w=12,
            h=8,
        ),
    )
    return b.build()
