"""The pipeline dashboard: freshness, per-partition progress, DLQ, quarantine and alerts.

What the ledger knows about the worker: when rows arrived (``received_at``), from which
source partition and offset, what was dead-lettered or quarantined and why, and every
alert transition (``alerts``: one row per firing and per resolve). The worker's own
position per partition is sampled into ``worker_progress`` (consumer lag); its other
figures (freshness when ClickHouse acknowledged a row, batch sizes, insert latency) are on
its ``/metrics`` endpoint for Prometheus (``dashboards/README.md``).
"""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dashboard_models

from prism.dashboards._panels import (
    TENANT_FILTER,
    Board,
    ch,
    stat_panel,
    table_panel,
    timeseries_panel,
)
from prism.dashboards._sre import EVENT_TIME_LAG_SQL

__all__ = ["UID", "pipeline"]

UID = "prism-pipeline"

# Every alert: its rule, key, tenant, when it fired and when (if ever) it resolved.
_ALERT_SPANS = f"""(
    SELECT alert_id, any(rule) AS rule, any(key) AS key, any(tenant_id) AS tenant,
           minIf(ts, state = 'firing') AS fired_at,
           countIf(state = 'resolved') > 0 AS resolved,
           if(resolved, maxIf(ts, state = 'resolved'), NULL) AS resolved_at,
           argMax(message, ts) AS message
    FROM alerts
    WHERE {TENANT_FILTER}
    GROUP BY alert_id
)"""


def pipeline(database: str | None = None) -> dashboard_models.Dashboard:
    """Is the pipeline keeping up, and what did it reject or alert on?

    Example::

        model = pipeline()
    """
    b = Board(
        UID,
        "Prism / Pipeline",
        "The worker as the ledger sees it: ingest freshness and throughput, progress per "
        "source partition, dead letters and quarantine by reason, and the alerts it raised "
        "(firing and resolved, with their age), and consumer lag as the workers sample it.",
        database=database,
        tags=("prism", "sre", "pipeline"),
    )
    b.add(
        stat_panel(
            "Ingest freshness",
            "Seconds since the newest accepted event reached the ledger (dashboard end "
            "minus max(received_at)); grows when the worker or ClickHouse stalls.",
            "s",
            ch(
                f"""
                SELECT dateDiff('millisecond', max(received_at), $__toTime) / 1000 AS freshness
                FROM run_events
                WHERE $__timeFilter(received_at) AND {TENANT_FILTER}
                """
            ),
            thresholds=((None, "green"), (60, "orange"), (300, "red")),
            decimals=1,
        ),
        stat_panel(
            "Alerts firing",
            "Alerts raised by the worker (limit exhaustion, stale runs) that have not "
            "resolved, whenever they fired.",
            "short",
            ch(f"SELECT countIf(NOT resolved) AS firing FROM {_ALERT_SPANS}"),
            thresholds=((None, "green"), (1, "orange")),
        ),
        stat_panel(
            "Dead letters (range)",
            "Records dead-lettered in the time range. Not tenant-scoped: a dead letter has "
            "no trusted tenant.",
            "short",
            ch("SELECT count() AS dead_letters FROM dead_letters WHERE $__timeFilter(received_at)"),
            thresholds=((None, "green"), (1, "orange")),
        ),
        stat_panel(
            "Quarantined (range)",
            "Events quarantined by run semantics in the time range.",
            "short",
            ch(
                f"""
                SELECT count() AS quarantined
                FROM quarantine
                WHERE $__timeFilter(received_at) AND {TENANT_FILTER}
                """
            ),
        ),
    )
    b.row("Throughput and progress")
    b.add(
        timeseries_panel(
            "Ledger writes per second by source partition",
            "Accepted events per second reaching the ledger, by the source partition they "
            "were read from (-1: a file replay). A partition whose curve drops to zero while "
            "others flow is stuck.",
            "eps",
            [
                ch(
                    f"""
                    SELECT $__timeInterval(received_at) AS time, toString(partition) AS partition,
                           count() / $__interval_s AS events
                    FROM run_events
                    WHERE $__timeFilter(received_at) AND {TENANT_FILTER}
                    GROUP BY time, partition
                    ORDER BY time, partition
                    """
                )
            ],
        ),
        timeseries_panel(
            "Delivery delay p50 / p99 (received_at - ts)",
            "How long accepted events took from emission to the ledger, per interval of "
            "arrival: the end-to-end lag a replay consumer sees.",
            "s",
            [ch(EVENT_TIME_LAG_SQL)],
        ),
    )
    b.add(
        table_panel(
            "Progress per source partition",
            "Per source and partition: the newest offset and arrival in the ledger, seconds "
            "since (at the dashboard's end), and events in the range. A partition far behind "
            "the others is stuck or lagging; compare with prism_consumer_lag on /metrics.",
            "short",
            ch(
                f"""
                SELECT source, partition, max(offset) AS newest_offset,
                       max(received_at) AS newest_arrival,
                       dateDiff('second', max(received_at), $__toTime) AS silent_for,
                       count() AS events
                FROM run_events
                WHERE $__timeFilter(received_at) AND {TENANT_FILTER}
                GROUP BY source, partition
                ORDER BY source, partition
                """
            ),
            h=7,
            field_units={"newest_arrival": "dateTimeAsIso", "silent_for": "s"},
        )
    )
    b.row("Consumer lag (from the workers)")
    b.add(
        timeseries_panel(
            "Consumer lag by source partition",
            "Records in Kafka not yet in the ledger, per source partition, as each worker "
            "sampled it (worker_progress, every PRISM_PROGRESS_INTERVAL_SECONDS). A curve "
            "that grows while the others stay flat is a stuck partition; all growing is a "
            "worker or ledger that cannot keep up. Not tenant-scoped.",
            "short",
            [
                ch(
                    """
                    SELECT $__timeInterval(ts) AS time,
                           concat(source, '[', toString(partition), ']') AS partition,
                           max(lag) AS lag
                    FROM worker_progress
                    WHERE $__timeFilter(ts)
                    GROUP BY time, partition
                    ORDER BY time, partition
                    """
                )
            ],
        ),
        table_panel(
            "Workers and their partitions",
            "Each worker's newest sample per partition: stored position, end offset, lag, "
            "and seconds since the sample and since its last stored batch (at the "
            "dashboard's end). A worker whose samples stopped has died or lost the group. "
            "Not tenant-scoped.",
            "short",
            ch(
                """
                SELECT worker, source, partition, argMax(processed, ts) AS processed,
                       argMax(end_offset, ts) AS end_offset, argMax(lag, ts) AS lag,
                       dateDiff('second', max(ts), $__toTime) AS sampled_ago,
                       dateDiff('second', argMax(last_batch_at, ts), $__toTime) AS last_batch_ago
                FROM worker_progress
                WHERE $__timeFilter(ts)
                GROUP BY worker, source, partition
                ORDER BY source, partition, worker
                """
            ),
            field_units={"sampled_ago": "s", "last_batch_ago": "s"},
        ),
    )
    b.row("Rejected records")
    b.add(
        timeseries_panel(
            "Dead letters by reason",
            "Records dead-lettered per interval by code (unparsable, contract_violation, "
            "oversized, unstorable, internal_error). Not tenant-scoped.",
            "short",
            [
                ch(
                    """
                    SELECT $__timeInterval(received_at) AS time, code, count() AS records
                    FROM dead_letters
                    WHERE $__timeFilter(received_at)
                    GROUP BY time, code
                    ORDER BY time, code
                    """
                )
            ],
            stacked=True,
            bars_style=True,
        ),
        timeseries_panel(
            "Quarantine by reason",
            "Events quarantined per interval by reason (post_terminal, conflicting_terminal, "
            "tenant_mismatch, duplicate_seq, duplicate_usage).",
            "short",
            [
                ch(
                    f"""
                    SELECT $__timeInterval(received_at) AS time, reason, count() AS events
                    FROM quarantine
                    WHERE $__timeFilter(received_at) AND {TENANT_FILTER}
                    GROUP BY time, reason
                    ORDER BY time, reason
                    """
                )
            ],
            stacked=True,
            bars_style=True,
        ),
    )
    b.add(
        table_panel(
            "Top dead-letter reasons",
            "Dead letters in the time range grouped by code and reason (field path and "
            "value), with the first and last arrival. Not tenant-scoped.",
            "short",
            ch(
                """
                SELECT code, substring(reason, 1, 120) AS reason, count() AS records,
                       min(received_at) AS first_seen, max(received_at) AS last_seen
                FROM dead_letters
                WHERE $__timeFilter(received_at)
                GROUP BY code, reason
                ORDER BY records DESC
                LIMIT 50
                """
            ),
            w=12,
            field_units={"first_seen": "dateTimeAsIso", "last_seen": "dateTimeAsIso"},
        ),
        table_panel(
            "Quarantine by reason",
            "Events quarantined in the time range by reason and event type.",
            "short",
            ch(
                f"""
                SELECT reason, type, count() AS events, uniq(run_id) AS runs
                FROM quarantine
                WHERE $__timeFilter(received_at) AND {TENANT_FILTER}
                GROUP BY reason, type
                ORDER BY events DESC
                """
            ),
            w=12,
        ),
    )
    b.row("Alert history")
    b.add(
        timeseries_panel(
            "Alerts raised by rule",
            "Alert transitions per interval by rule and state (firing, resolved).",
            "short",
            [
                ch(
                    f"""
                    SELECT $__timeInterval(ts) AS time, concat(rule, ' ', state) AS transition,
                           count() AS alerts
                    FROM alerts
                    WHERE $__timeFilter(ts) AND {TENANT_FILTER}
                    GROUP BY time, transition
                    ORDER BY time, transition
                    """
                )
            ],
            stacked=True,
            bars_style=True,
            w=24,
        )
    )
    b.add(
        table_panel(
            "Alerts",
            "Every alert that fired in the time range: rule, key (limit axis or run id), "
            "tenant, state, when it fired and resolved, and its age (until it resolved, or "
            "until the dashboard's end while firing).",
            "short",
            ch(
                f"""
                SELECT rule, key, tenant, if(resolved, 'resolved', 'firing') AS state,
                       fired_at, resolved_at,
                       dateDiff('second', fired_at, ifNull(resolved_at, $__toTime)) AS age,
                       message
                FROM {_ALERT_SPANS}
                WHERE $__timeFilter(fired_at)
                ORDER BY resolved, fired_at DESC
                LIMIT 500
                """
            ),
            field_units={"fired_at": "dateTimeAsIso", "resolved_at": "dateTimeAsIso", "age": "s"},
        )
    )
    return b.build()
