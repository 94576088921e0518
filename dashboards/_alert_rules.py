"""What each alert rule asks the ledger, when it pages, and its runbook.

A rule pages only when a human must act: rates are judged against the baseline before the
window (never "more than 0"), and freshness only while events are expected. Every query
returns one numeric column (plus string columns that become labels), and uses
``$__toTime`` for "now", which is when Grafana evaluates the rule, so a replay over a
fixed range gives what Grafana would have seen then. The thresholds and windows come from
settings (``PRISM_ALERT_*``, ``dashboards/README.md``, "Alert rules").
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["AlertSpec", "AlertThresholds", "alert_specs"]


@dataclass(frozen=True)
class AlertThresholds:
    """Thresholds and windows of the provisioned alert rules (defaults: ``PRISM_ALERT_*``).

    Example::

        AlertThresholds(freshness_s=120, dead_letter_factor=5.0)
    """

    exhaustion_per_minute: float = 1.0  # limit deaths per minute on one axis
    exhaustion_window_s: int = 600
    dead_letter_window_s: int = 300
    dead_letter_baseline_s: int = 86_400
    dead_letter_factor: float = 3.0  # recent rate above factor x baseline rate
    dead_letter_min_per_minute: float = 1.0  # ... and above this floor
    stale_window_s: int = 3_600
    stale_baseline_s: int = 86_400
    stale_factor: float = 3.0
    stale_min_runs: int = 5  # new stale runs in the window, at least
    freshness_s: int = 300  # seconds since the newest event, while events are expected
    freshness_lookback_s: int = 3_600
    freshness_expect_s: int = 86_400  # a run active this recently that is still open


@dataclass(frozen=True)
class AlertSpec:
    """One rule: its query (range ``window_s`` back from now), threshold and runbook."""

    uid: str
    title: str
    sql: str
    window_s: int
    threshold: float  # the rule fires when a series' last value is above it
    summary: str
    description: str
    runbook: str
    severity: str
    no_data: str  # "OK" | "NoData" | "Alerting"
    for_: str


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:g} min" if seconds < 7200 else f"{seconds / 3600:g} h"


def _runbook(meaning: str, query: str, action: str) -> str:
    return f"What it means: {meaning}\n\nQuery to run:\n{query}\n\nWhat to do: {action}"


def _exhaustion(t: AlertThresholds) -> AlertSpec:
    return AlertSpec(
        "prism-limit-exhaustion-rate",
        "Run-limit exhaustion rate per axis",
        f"""
        SELECT axis, count() / {t.exhaustion_window_s / 60:g} AS deaths_per_minute
        FROM (
            SELECT ifNull(exhaustion_axis, exhaustion_limit) AS axis,
                   ifNull(finished_at, last_event_at) AS died_at
            FROM runs
            WHERE exhaustion_limit IS NOT NULL OR exhaustion_axis IS NOT NULL
        )
        WHERE $__timeFilter(died_at)
        GROUP BY axis
        """,
        t.exhaustion_window_s,
        t.exhaustion_per_minute,
        "Runs are dying on limit {{ $labels.axis }}",
        f"More than {t.exhaustion_per_minute:g} runs per minute died on the "
        "{{ $labels.axis }} limit over the last "
        f"{_minutes(t.exhaustion_window_s)}.",
        _runbook(
            "agents keep hitting one run limit (maxTurns, maxInputTokens, maxWallMs, "
            "maxCost): a limit set too low, a prompt or tool loop, or a model change.",
            'prism-pipeline query "SELECT tenant_id, agent_id, model, count() AS deaths '
            "FROM runs WHERE ifNull(exhaustion_axis, exhaustion_limit) = '<axis>' AND "
            f"finished_at > now() - INTERVAL {t.exhaustion_window_s} SECOND "
            'GROUP BY ALL ORDER BY deaths DESC"',
            "open one of the runs in the Run explorer (Limit exhaustion panel: observed "
            "against maximum, closest axes); if one agent or model dominates, roll it back "
            "or raise its limit with its owner; if every tenant is affected, check the "
            "latest runtime or limit-config deploy.",
        ),
        "warning",
        "OK",
        "5m",
    )


def _above_baseline(count: str, at: str, window_s: int, baseline_s: int) -> tuple[str, str]:
    """(recent per minute, baseline per minute) of ``count`` rows by their time ``at``."""
    recent = f"{count}If({at} > $__toTime - INTERVAL {window_s} SECOND) / {window_s / 60:g}"
    baseline = f"{count}If({at} <= $__toTime - INTERVAL {window_s} SECOND) / {baseline_s / 60:g}"
    return recent, baseline


def _dead_letters(t: AlertThresholds) -> AlertSpec:
    recent, baseline = _above_baseline(
        "count", "received_at", t.dead_letter_window_s, t.dead_letter_baseline_s
    )
    return AlertSpec(
        "prism-dead-letter-rate",
        "Dead-letter rate above baseline",
        f"""
        SELECT ({recent})
               / greatest(({baseline}) * {t.dead_letter_factor:g},
                          {t.dead_letter_min_per_minute:g}) AS rate_over_allowed
        FROM dead_letters
        WHERE $__timeFilter(received_at)
        """,
        t.dead_letter_window_s + t.dead_letter_baseline_s,
        1.0,
        "Dead letters are arriving faster than usual",
        f"Records go to the dead-letter log faster over the last "
        f"{_minutes(t.dead_letter_window_s)} than {t.dead_letter_factor:g} x their rate over "
        f"the {_minutes(t.dead_letter_baseline_s)} before (and above "
        f"{t.dead_letter_min_per_minute:g} per minute). Value: recent rate / allowed rate.",
        _runbook(
            "a producer started sending records the pipeline cannot parse or that break the "
            "contract (a runtime release, a schema change, an oversized payload).",
            'prism-pipeline query "SELECT code, substring(reason, 1, 80) AS why, count() '
            f"AS n FROM dead_letters WHERE received_at > now() - INTERVAL "
            f'{t.dead_letter_window_s} SECOND GROUP BY ALL ORDER BY n DESC"',
            "read the top reason (the field path and value); find the producer from the "
            "preview and the DLQ record headers (source topic, partition, offset); roll back "
            "or fix that runtime, then replay the DLQ records once fixed. The dead letters are "
            "counted, never lost; nothing is billed from them.",
        ),
        "critical",
        "OK",
        "0s",  # the 5-minute window already smooths; a pending period would only delay
    )


def _stale_runs(t: AlertThresholds) -> AlertSpec:
    recent, baseline = _above_baseline("count", "ts", t.stale_window_s, t.stale_baseline_s)
    per_window = t.stale_window_s / 60
    return AlertSpec(
        "prism-stale-run-growth",
        "Stale runs growing",
        f"""
        SELECT ({recent})
               / greatest(({baseline}) * {t.stale_factor:g},
                          {t.stale_min_runs} / {per_window:g}) AS growth_over_allowed
        FROM alerts
        WHERE rule = 'stale_run' AND state = 'firing' AND $__timeFilter(ts)
          AND alert_id NOT IN (
              SELECT alert_id FROM alerts
              WHERE rule = 'stale_run' AND state = 'resolved' AND ts <= $__toTime
          )
        """,
        t.stale_window_s + t.stale_baseline_s,
        1.0,
        "Runs are going stale faster than usual",
        f"More runs were marked incomplete (no terminal within the stale threshold) over the "
        f"last {_minutes(t.stale_window_s)} than {t.stale_factor:g} x the rate of the "
        f"{_minutes(t.stale_baseline_s)} before, and at least {t.stale_min_runs}. Runs that "
        "reached their terminal later do not count. Value: recent rate / allowed rate.",
        _runbook(
            "agent runtimes stop sending events mid-run (crashes, a deploy that kills "
            "workers, a publisher that cannot reach Kafka), or a partition of the input "
            "topic stopped being consumed.",
            'prism-pipeline query "SELECT tenant_id, agent_id, model, count() AS stale '
            "FROM runs WHERE status = 'incomplete' AND last_event_at > now() - INTERVAL "
            f'{t.stale_window_s + 3600} SECOND GROUP BY ALL ORDER BY stale DESC"',
            "if one agent or tenant dominates, its runtime is dying: check its logs and its "
            "publisher's drop counters; if all are affected, check the worker's lag on "
            "/metrics (a stuck partition) and the Pipeline dashboard. Runs keep their "
            "events; a late terminal resolves them.",
        ),
        "warning",
        "OK",
        "10m",
    )


def _freshness(t: AlertThresholds) -> AlertSpec:
    return AlertSpec(
        "prism-ingest-freshness",
        "Ingest freshness",
        f"""
        SELECT if(open_runs = 0, 0, dateDiff('second', newest, $__toTime)) AS freshness_s
        FROM (
            SELECT
                (SELECT count() FROM runs
                 WHERE status = 'running' AND last_event_at <= $__toTime
                   AND last_event_at > $__toTime - INTERVAL {t.freshness_expect_s} SECOND)
                    AS open_runs,
                (SELECT maxOrNull(received_at) FROM run_events
                 WHERE $__timeFilter(received_at)) AS newest
        )
        WHERE open_runs = 0 OR newest IS NOT NULL
        """,
        t.freshness_lookback_s,
        float(t.freshness_s),
        "The ledger stopped receiving events",
        f"The newest event reached the ledger more than {t.freshness_s} s ago while runs "
        f"active in the last {_minutes(t.freshness_expect_s)} are still open. With no open "
        "run, no event is expected and the rule is OK; with open runs and no event at all "
        f"in the last {_minutes(t.freshness_lookback_s)} it reports NoData.",
        _runbook(
            "events are expected (runs are open) but none reached the ledger: the worker is "
            "down or stuck, ClickHouse refuses inserts, or producers cannot reach Kafka.",
            "curl -s http://<worker>:9464/healthz; curl -s http://<worker>:9464/metrics | "
            'grep prism_consumer_lag; prism-pipeline query "SELECT max(received_at), '
            'count() FROM run_events WHERE received_at > now() - INTERVAL 1 HOUR"',
            "lag growing: the worker is alive but slow or blocked on ClickHouse (its log "
            "says which; add partitions and workers, or fix ClickHouse); no worker answers: "
            "restart it (offsets are committed only after the ledger holds the rows, so "
            "nothing is lost); lag 0 and healthy: producers stopped (check the runtimes' "
            "publisher). A run left open when all traffic stops keeps events expected: "
            "find it in the Run explorer.",
        ),
        "critical",
        "NoData",
        "5m",
    )


def alert_specs(t: AlertThresholds = AlertThresholds()) -> list[AlertSpec]:
    """Every rule, in the order they are provisioned.

    Example::

        [s.uid for s in alert_specs()]
    """
    return [_exhaustion(t), _stale_runs(t), _dead_letters(t), _freshness(t)]
