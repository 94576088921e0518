"""The run explorer: a table of runs and, for the ``run_id`` variable, that run's timeline.

The timeline panels show the run's events in ``seq`` order, its turns, its tool calls, the
limit exhaustion of the run and its delegated children, and the children themselves. Every
panel filters by the selected tenants too, so a run id never shows another tenant's rows.
"""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dashboard_models

from prism.dashboards._panels import (
    TENANT_FILTER,
    Board,
    ch,
    decoded,
    query_variable,
    table_panel,
)

__all__ = ["UID", "run_explorer"]

UID = "prism-run-explorer"

RUN_ID = decoded("run_id")  # the selected run id, safe whatever it holds
RUN = f"run_id = {RUN_ID}"
_RUN_LINK = ("Explore this run", "/d/" + UID + "?${__url_time_range}&var-run_id=${__value.raw}")

_EVENT_SUMMARY = """
multiIf(
    type = 'provider_turn_finished',
        format('turn {} attempt {}: {} in {} ms',
               JSONExtractRaw(payload, 'turn'), JSONExtractRaw(payload, 'attempt'),
               JSONExtractString(payload, 'stopReason'), JSONExtractRaw(payload, 'latencyMs')),
    type = 'tool_call_finished',
        format('{} {} in {} ms', JSONExtractString(payload, 'tool'),
               if(JSONExtractBool(payload, 'ok'), 'ok', JSONExtractString(payload, 'errorCode')),
               JSONExtractRaw(payload, 'durationMs')),
    type = 'run_limit_exceeded',
        format('{}: observed {} > maximum {}', JSONExtractString(payload, 'limit'),
               JSONExtractRaw(payload, 'observed'), JSONExtractRaw(payload, 'maximum')),
    type = 'budget_exhausted',
        format('axis {}, closest {}', JSONExtractString(payload, 'axis'),
               JSONExtractRaw(payload, 'closest')),
    type IN ('child_milestone', 'child_failed'),
        format('delegation {} child {} run {}', JSONExtractString(payload, 'delegationId'),
               JSONExtractString(payload, 'childId'), JSONExtractString(payload, 'childRunId')),
    substring(payload, 1, 200)
)"""


def run_explorer(database: str | None = None) -> dashboard_models.Dashboard:
    """Find a run, then follow it event by event.

    Example::

        model = run_explorer()
    """
    b = Board(
        UID,
        "Prism / Run explorer",
        "Runs in the time range and, for the selected run_id, its timeline: events in seq "
        "order, turns, tool calls, limit exhaustion and delegated children.",
        database=database,
        tags=("prism", "runs"),
        time_from="now-24h",
    )
    b.variable(
        query_variable(
            "run_id",
            "Run",
            f"""
            SELECT run_id FROM runs
            WHERE $__timeFilter(last_event_at) AND {TENANT_FILTER}
            ORDER BY last_event_at DESC
            LIMIT 500
            """,
            "The run whose timeline is shown: one of the 500 most recent runs of the selected "
            "tenants in the time range (the runs table lists the same runs)",
            include_all=False,
            multi=False,
        )
    )
    b.row("Runs")
    b.add(
        table_panel(
            "Runs",
            "Runs of the selected tenants with activity in the time range, newest first. "
            "Click a run id to show its timeline below.",
            "short",
            ch(
                f"""
                SELECT run_id, tenant_id, agent_id, model, status, started_at, finished_at,
                       dateDiff('millisecond', started_at, finished_at) / 1000 AS duration,
                       model_turns, deterministic_turns, tool_calls, cache_hit_rate,
                       ifNull(exhaustion_axis, exhaustion_limit) AS exhausted_on,
                       missing_count AS missing_events, parent_run_id
                FROM runs
                WHERE $__timeFilter(last_event_at) AND {TENANT_FILTER}
                ORDER BY last_event_at DESC
                LIMIT 500
                """
            ),
            h=10,
            field_units={"duration": "s", "cache_hit_rate": "percentunit"},
            field_links={"run_id": _RUN_LINK},
        )
    )
    b.row("Selected run")
    b.add(
        table_panel(
            "Run record",
            "The selected run's record: status, terminal, stop and error details, "
            "exhaustion, gaps (missing seqs) and the usage mismatch flag.",
            "short",
            ch(
                f"""
                SELECT run_id, status, terminal_type, terminal_seq, stop_reason, finish_reason,
                       error_code, failure_class, denied_reason, abort_reason, started_at,
                       finished_at, event_count, max_seq, missing_count, missing_ranges,
                       usage_mismatch, clock_skew, cache_hit_rate, parent_run_id, bundle_digest
                FROM runs
                WHERE {RUN} AND {TENANT_FILTER}
                """
            ),
            h=5,
            field_units={"cache_hit_rate": "percentunit"},
        ),
        table_panel(
            "Timeline",
            "Every accepted event of the run in seq order, with the time since the run's "
            "first event and a one-line summary of its payload.",
            "short",
            ch(
                f"""
                SELECT seq, ts,
                       dateDiff('millisecond', min(ts) OVER (), ts) / 1000 AS since_start,
                       type, {_EVENT_SUMMARY} AS summary
                FROM run_events
                WHERE {RUN} AND {TENANT_FILTER}
                ORDER BY seq
                """
            ),
            h=12,
            field_units={"since_start": "s"},
        ),
    )
    b.add(
        table_panel(
            "Turns",
            "Model and deterministic turns of the run: stop reason, latency, tools offered, "
            "tokens, cache reads and where the usage came from (reported or estimated).",
            "short",
            ch(
                f"""
                SELECT turn, attempt, kind, ts, stop_reason, latency_ms, middleware,
                       tools_count, input_tokens, output_tokens, cache_read_tokens,
                       cache_write_tokens, cache_hit_rate, usage_source, usage_confidence
                FROM turns
                WHERE {RUN} AND {TENANT_FILTER}
                ORDER BY turn, attempt
                """
            ),
            w=12,
            h=9,
            field_units={"latency_ms": "ms", "cache_hit_rate": "percentunit"},
        ),
        table_panel(
            "Tool calls",
            "tool_call_finished events of the run: tool, outcome and duration.",
            "short",
            ch(
                f"""
                SELECT seq, ts, JSONExtractUInt(payload, 'turn') AS turn,
                       JSONExtractString(payload, 'tool') AS tool,
                       JSONExtractBool(payload, 'ok') AS ok,
                       JSONExtractString(payload, 'errorCode') AS error_code,
                       JSONExtractFloat(payload, 'durationMs') AS duration_ms
                FROM run_events
                WHERE {RUN} AND type = 'tool_call_finished' AND {TENANT_FILTER}
                ORDER BY seq
                """
            ),
            w=12,
            h=9,
            field_units={"duration_ms": "ms"},
        ),
    )
    b.add(
        table_panel(
            "Limit exhaustion (run and children)",
            "The breached limit (maximum, observed) and the budget attribution (axis, "
            "closest axes) of the run and of its delegated children.",
            "short",
            ch(
                f"""
                SELECT run_id, if({RUN}, 'this run', 'child') AS scope, status,
                       exhaustion_limit, exhaustion_maximum, exhaustion_observed,
                       exhaustion_axis, exhaustion_closest, finished_at
                FROM runs
                WHERE ({RUN} OR parent_run_id = {RUN_ID})
                  AND (exhaustion_limit IS NOT NULL OR exhaustion_axis IS NOT NULL)
                  AND {TENANT_FILTER}
                ORDER BY finished_at
                """
            ),
            w=12,
            h=7,
        ),
        table_panel(
            "Delegated children",
            "Child runs delegated by the selected run, with their outcome.",
            "short",
            ch(
                f"""
                SELECT run_id AS child_run_id, delegation_id, child_id, status, model,
                       model_turns, tool_calls, failure_class,
                       ifNull(exhaustion_axis, exhaustion_limit) AS exhausted_on,
                       started_at, finished_at
                FROM runs
                WHERE parent_run_id = {RUN_ID} AND {TENANT_FILTER}
                ORDER BY started_at
                """
            ),
            w=12,
            h=7,
            field_links={"child_run_id": _RUN_LINK},
        ),
    )
    return b.build()
