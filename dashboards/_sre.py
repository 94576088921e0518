"""The SRE overview dashboard: throughput, outcomes, latency, limit deaths, rejects, freshness."""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dashboard_models

from prism.dashboards._palette import STATUS_COLORS, status_columns
from prism.dashboards._panels import (
    TENANT_FILTER,
    Board,
    bars,
    ch,
    stat_panel,
    table_panel,
    timeseries_panel,
)

__all__ = ["EVENT_TIME_LAG_SQL", "UID", "sre_overview"]

UID = "prism-sre-overview"

# Runs are placed in time by their start, or their last event while the start is unknown.
_RUN_TIME = "ifNull(started_at, last_event_at)"

# Emission (ts) to ledger (received_at), median and p99 per interval of arrival; the SRE
# overview and the pipeline dashboard both chart it.
EVENT_TIME_LAG_SQL = f"""
    SELECT $__timeInterval(received_at) AS time,
           quantile(0.5)(dateDiff('millisecond', ts, received_at)) / 1000 AS p50,
           quantile(0.99)(dateDiff('millisecond', ts, received_at)) / 1000 AS p99
    FROM run_events
    WHERE $__timeFilter(received_at) AND {TENANT_FILTER}
    GROUP BY time
    ORDER BY time
"""


def sre_overview(database: str | None = None) -> dashboard_models.Dashboard:
    """Pipeline health at a glance, for the on-call engineer.

    Example::

        model = sre_overview()            # plain view names, for Grafana
        model = sre_overview("t_1234")    # views of another database, for tests
    """
    b = Board(
        UID,
        "Prism / SRE overview",
        "Health of the prism pipeline: event throughput, run outcomes and latency, limit "
        "deaths, dead letters and quarantine, stale runs and ingest freshness.",
        database=database,
        tags=("prism", "sre"),
    )
    b.row("Freshness")
    b.add(
        stat_panel(
            "Ingest freshness",
            "Seconds since the newest event reached the ledger (now() - max(received_at)); "
            "grows when the worker or the sink stalls.",
            "s",
            ch(
                f"""
                SELECT dateDiff('millisecond', max(received_at), now64(3)) / 1000 AS freshness_s
                FROM run_events
                WHERE {TENANT_FILTER}
                """
            ),
            thresholds=((None, "green"), (60, "orange"), (300, "red")),
            decimals=1,
        ),
        stat_panel(
            "Stale (incomplete) runs",
            "Runs marked incomplete: no terminal event within the stale threshold after their "
            "last event. They are alerted on, never given a made-up terminal.",
            "short",
            ch(
                f"""
                SELECT count() AS incomplete_runs
                FROM runs
                WHERE status = 'incomplete' AND {TENANT_FILTER}
                """
            ),
            thresholds=((None, "green"), (1, "orange")),
        ),
        stat_panel(
            "Dead letters (range)",
            "Records that could not be parsed or broke the contract in the time range. Not "
            "tenant-scoped: a dead letter has no trusted tenant.",
            "short",
            ch(
                """
                SELECT count() AS dead_letters
                FROM dead_letters
                WHERE $__timeFilter(received_at)
                """
            ),
            thresholds=((None, "green"), (1, "red")),
        ),
        stat_panel(
            "Quarantined events (range)",
            "Valid events rejected by run semantics (post_terminal, conflicting_terminal) in "
            "the time range.",
            "short",
            ch(
                f"""
                SELECT count() AS quarantined
                FROM quarantine
                WHERE $__timeFilter(received_at) AND {TENANT_FILTER}
                """
            ),
            thresholds=((None, "green"), (1, "orange")),
        ),
    )
    b.add(
        timeseries_panel(
            "Ingest lag (received_at - ts)",
            "How long events took from emission (ts) to the ledger (received_at): median and "
            "p99 per interval of arrival.",
            "s",
            [ch(EVENT_TIME_LAG_SQL)],
            w=24,
        )
    )
    b.row("Throughput and outcomes")
    b.add(
        timeseries_panel(
            "Events ingested per second",
            "Accepted events per second by the time they reached the ledger; a dip while "
            "emission goes on is the pipeline falling behind.",
            "eps",
            [
                ch(
                    f"""
                    SELECT $__timeInterval(received_at) AS time, count() / $__interval_s AS ingested
                    FROM run_events
                    WHERE $__timeFilter(received_at) AND {TENANT_FILTER}
                    GROUP BY time
                    ORDER BY time
                    """
                )
            ],
            w=6,
        ),
        timeseries_panel(
            "Events emitted per second",
            "Accepted events per second by their own timestamp: what the runtimes emitted, "
            "late arrivals included.",
            "eps",
            [
                ch(
                    f"""
                    SELECT $__timeInterval(ts) AS time, count() / $__interval_s AS emitted
                    FROM run_events
                    WHERE $__timeFilter(ts) AND {TENANT_FILTER}
                    GROUP BY time
                    ORDER BY time
                    """
                )
            ],
            w=6,
        ),
        timeseries_panel(
            "Runs by status",
            "Runs per interval by their current status, placed at their start (or last event "
            "while the start is unknown); one fixed colour per status.",
            "short",
            [
                ch(
                    f"""
                    SELECT $__timeInterval(run_time) AS time, {status_columns()}
                    FROM (
                        SELECT {_RUN_TIME} AS run_time, status, tenant_id FROM runs
                    )
                    WHERE $__timeFilter(run_time) AND {TENANT_FILTER}
                    GROUP BY time
                    ORDER BY time
                    """
                )
            ],
            stacked=True,
            bars_style=True,
            colors=STATUS_COLORS,
        ),
    )
    b.add(
        timeseries_panel(
            "Terminal latency (finished_at - started_at)",
            "Wall time from agent_started to the terminal event for runs that finished in each "
            "interval: p50, p90 and p99.",
            "s",
            [
                ch(
                    f"""
                    SELECT $__timeInterval(finished_at) AS time,
                           quantile(0.5)(duration_s) AS p50,
                           quantile(0.9)(duration_s) AS p90,
                           quantile(0.99)(duration_s) AS p99
                    FROM (
                        SELECT assumeNotNull(finished_at) AS finished_at, tenant_id,
                               dateDiff('millisecond', started_at, finished_at) / 1000 AS duration_s
                        FROM runs
                        WHERE started_at IS NOT NULL AND finished_at IS NOT NULL
                    )
                    WHERE $__timeFilter(finished_at) AND {TENANT_FILTER}
                    GROUP BY time
                    ORDER BY time
                    """
                )
            ],
        ),
        timeseries_panel(
            "Limit deaths by axis",
            "Runs killed by a run limit (run_limit_exceeded -> budget_exhausted -> error) per "
            "interval, by the limit axis that was breached.",
            "short",
            [
                ch(
                    f"""
                    SELECT $__timeInterval(died_at) AS time, axis, count() AS deaths
                    FROM (
                        SELECT ifNull(finished_at, last_event_at) AS died_at, tenant_id,
                               ifNull(exhaustion_axis, exhaustion_limit) AS axis
                        FROM runs
                        WHERE exhaustion_limit IS NOT NULL OR exhaustion_axis IS NOT NULL
                    )
                    WHERE $__timeFilter(died_at) AND {TENANT_FILTER}
                    GROUP BY time, axis
                    ORDER BY time, axis
                    """
                )
            ],
            stacked=True,
            bars_style=True,
        ),
    )
    b.add(
        bars(
            "Failure classes",
            "Failed and aborted runs in the time range by error failure class (quota, auth, "
            "rate_limited, transient, permanent, unknown; 'none' when the error had no class).",
            "short",
            ch(
                f"""
                SELECT ifNull(failure_class, 'none') AS failure, count() AS runs
                FROM (
                    SELECT failure_class, tenant_id, {_RUN_TIME} AS run_time, status FROM runs
                )
                WHERE status IN ('failed', 'aborted') AND $__timeFilter(run_time)
                  AND {TENANT_FILTER}
                GROUP BY failure
                ORDER BY runs DESC
                """
            ),
            w=8,
        ),
        timeseries_panel(
            "Dead letters per minute by reason",
            "Records sent to the dead-letter log per minute, by reason code (unparsable, "
            "contract_violation, oversized). Not tenant-scoped.",
            "cpm",
            [
                ch(
                    """
                    SELECT $__timeInterval(received_at) AS time, code,
                           count() * 60 / $__interval_s AS per_minute
                    FROM dead_letters
                    WHERE $__timeFilter(received_at)
                    GROUP BY time, code
                    ORDER BY time, code
                    """
                )
            ],
            w=8,
        ),
        timeseries_panel(
            "Quarantine per minute by reason",
            "Events quarantined per minute by reason (post_terminal, conflicting_terminal).",
            "cpm",
            [
                ch(
                    f"""
                    SELECT $__timeInterval(received_at) AS time, reason,
                           count() * 60 / $__interval_s AS per_minute
                    FROM quarantine
                    WHERE $__timeFilter(received_at) AND {TENANT_FILTER}
                    GROUP BY time, reason
                    ORDER BY time, reason
                    """
                )
            ],
            w=8,
        ),
    )
    b.row("Stale runs")
    b.add(
        table_panel(
            "Incomplete runs",
            "Runs with no terminal event within the stale threshold, newest last event first; "
            "silent_for is the time since their last event.",
            "short",
            ch(
                f"""
                SELECT run_id, tenant_id, agent_id, model, last_event_at,
                       dateDiff('second', last_event_at, now64(3)) AS silent_for,
                       event_count, max_seq
                FROM runs
                WHERE status = 'incomplete' AND $__timeFilter(last_event_at)
                  AND {TENANT_FILTER}
                ORDER BY last_event_at DESC
                LIMIT 200
                """
            ),
            h=8,
            field_units={"silent_for": "s", "last_event_at": "dateTimeAsIso"},
        )
    )
    return b.build()
