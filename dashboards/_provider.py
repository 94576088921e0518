"""The provider health dashboard: model-turn latency, errors, stop reasons and retries.

Turn figures come from the ``turns`` view (model turns only: deterministic turns never
reach a provider), one row per turn attempt; an attempt above 1 is a retry. Run figures
(failure classes) come from ``runs``, where a run's error terminal names its class.
"""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dashboard_models

from prism.dashboards._panels import (
    TENANT_FILTER,
    Board,
    ch,
    query_variable,
    selected,
    stat_panel,
    table_panel,
    timeseries_panel,
)

__all__ = ["UID", "provider_health"]

UID = "prism-provider-health"

PROVIDER_FILTER = f"$__conditionalAll({selected('provider', 'provider')}, $provider)"
# Model turn attempts of the chosen tenants and providers in the time range.
_TURNS = f"kind = 'model' AND $__timeFilter(ts) AND {TENANT_FILTER} AND {PROVIDER_FILTER}"
_SERIES = "concat(ifNull(provider, '?'), ' / ', ifNull(model, '?'))"
_RUN_TIME = "ifNull(finished_at, last_event_at)"


def _latency(q: float, name: str) -> str:
    return f"""
        SELECT $__timeInterval(ts) AS time, {_SERIES} AS series,
               quantile({q})(latency_ms) AS {name}
        FROM turns
        WHERE {_TURNS} AND latency_ms IS NOT NULL
        GROUP BY time, series
        ORDER BY time, series
        """


def provider_health(database: str | None = None) -> dashboard_models.Dashboard:
    """Latency percentiles, error rates, stop reasons and retries per provider and model.

    Example::

        model = provider_health()
    """
    b = Board(
        UID,
        "Prism / Provider health",
        "Model providers as the agents see them: turn latency p50/p95/p99 per provider and "
        "model, provider errors and run failure classes, stop reasons, and retried turns.",
        database=database,
        tags=("prism", "sre", "providers"),
    )
    b.variable(
        query_variable(
            "provider",
            "Provider",
            f"""
            SELECT DISTINCT provider FROM turns
            WHERE kind = 'model' AND provider IS NOT NULL AND $__timeFilter(ts)
              AND {TENANT_FILTER}
            ORDER BY provider
            """,
            "Providers with model turns in the time range (All = every provider)",
            include_all=True,
            multi=True,
        )
    )
    b.add(
        stat_panel(
            "Turn latency p95",
            "95th percentile of model-turn latency (latencyMs of provider_turn_finished) "
            "over the time range, every chosen provider and model together.",
            "ms",
            ch(f"SELECT quantile(0.95)(latency_ms) AS p95 FROM turns WHERE {_TURNS}"),
            thresholds=((None, "green"), (10_000, "orange"), (30_000, "red")),
            decimals=0,
        ),
        stat_panel(
            "Provider error rate",
            "Share of model-turn attempts that stopped with provider_error in the time range.",
            "percentunit",
            ch(
                f"""
                SELECT countIf(stop_reason = 'provider_error') / nullIf(count(), 0) AS error_rate
                FROM turns
                WHERE {_TURNS}
                """
            ),
            thresholds=((None, "green"), (0.02, "orange"), (0.1, "red")),
            decimals=2,
        ),
        stat_panel(
            "Retried attempts",
            "Share of model-turn attempts that are retries (attempt > 1) in the time range.",
            "percentunit",
            ch(
                f"""
                SELECT countIf(attempt > 1) / nullIf(count(), 0) AS retried_share
                FROM turns
                WHERE {_TURNS}
                """
            ),
            thresholds=((None, "green"), (0.05, "orange"), (0.2, "red")),
            decimals=2,
        ),
        stat_panel(
            "Runs failed on provider errors",
            "Runs of the chosen providers that ended with an error terminal naming a failure "
            "class (quota, auth, rate_limited, transient, permanent, unknown), in the range.",
            "short",
            ch(
                f"""
                SELECT count() AS failed_runs
                FROM (SELECT {_RUN_TIME} AS at, failure_class, provider, tenant_id FROM runs)
                WHERE failure_class IS NOT NULL AND $__timeFilter(at) AND {TENANT_FILTER}
                  AND {PROVIDER_FILTER}
                """
            ),
            thresholds=((None, "green"), (1, "orange")),
        ),
    )
    b.row("Latency")
    for q, name, title in ((0.5, "p50", "p50"), (0.95, "p95", "p95"), (0.99, "p99", "p99")):
        b.add(
            timeseries_panel(
                f"Turn latency {title} by provider / model",
                f"The {title} of model-turn latency (ms) per interval, one series per "
                "provider / model.",
                "ms",
                [ch(_latency(q, name))],
                w=8,
            )
        )
    b.row("Errors, stop reasons and retries")
    b.add(
        timeseries_panel(
            "Provider error rate by provider / model",
            "Share of each interval's model-turn attempts that stopped with provider_error, "
            "per provider / model.",
            "percentunit",
            [
                ch(
                    f"""
                    SELECT $__timeInterval(ts) AS time, {_SERIES} AS series,
                           countIf(stop_reason = 'provider_error') / count() AS error_rate
                    FROM turns
                    WHERE {_TURNS}
                    GROUP BY time, series
                    ORDER BY time, series
                    """
                )
            ],
        ),
        timeseries_panel(
            "Run failures by failure class",
            "Runs per interval that ended on an error terminal, by its failure class "
            "('none' when the error named no class), placed at their terminal.",
            "short",
            [
                ch(
                    f"""
                    SELECT $__timeInterval(at) AS time, ifNull(failure_class, 'none') AS class,
                           count() AS runs
                    FROM (
                        SELECT {_RUN_TIME} AS at, failure_class, provider, tenant_id, status
                        FROM runs
                    )
                    WHERE status IN ('failed', 'aborted') AND $__timeFilter(at)
                      AND {TENANT_FILTER} AND {PROVIDER_FILTER}
                    GROUP BY time, class
                    ORDER BY time, class
                    """
                )
            ],
            stacked=True,
            bars_style=True,
        ),
    )
    b.add(
        timeseries_panel(
            "Stop reasons",
            "Model-turn attempts per interval by stop reason (end_turn, tool_calls, "
            "max_output_tokens, content_filter, abort, provider_error, unknown).",
            "short",
            [
                ch(
                    f"""
                    SELECT $__timeInterval(ts) AS time, ifNull(stop_reason, 'none') AS reason,
                           count() AS attempts
                    FROM turns
                    WHERE {_TURNS}
                    GROUP BY time, reason
                    ORDER BY time, reason
                    """
                )
            ],
            stacked=True,
            bars_style=True,
        ),
        timeseries_panel(
            "Retried attempts share by provider / model",
            "Share of each interval's model-turn attempts that are retries (attempt > 1), "
            "per provider / model.",
            "percentunit",
            [
                ch(
                    f"""
                    SELECT $__timeInterval(ts) AS time, {_SERIES} AS series,
                           countIf(attempt > 1) / count() AS retried_share
                    FROM turns
                    WHERE {_TURNS}
                    GROUP BY time, series
                    ORDER BY time, series
                    """
                )
            ],
        ),
    )
    b.add(
        table_panel(
            "Provider / model summary",
            "Per provider / model over the time range: model-turn attempts, latency "
            "percentiles, the share that errored, were retried, hit max_output_tokens or the "
            "content filter, and runs failed by failure class.",
            "short",
            ch(
                f"""
                SELECT t.provider AS provider, t.model AS model, t.attempts AS attempts,
                       t.p50_ms AS p50_ms, t.p95_ms AS p95_ms, t.p99_ms AS p99_ms,
                       t.error_rate AS error_rate, t.retried AS retried,
                       t.max_output AS max_output, t.filtered AS filtered,
                       ifNull(r.failed, 0) AS failed_runs, r.classes AS failure_classes
                FROM (
                    SELECT ifNull(provider, '?') AS provider, ifNull(model, '?') AS model,
                           count() AS attempts,
                           quantile(0.5)(latency_ms) AS p50_ms,
                           quantile(0.95)(latency_ms) AS p95_ms,
                           quantile(0.99)(latency_ms) AS p99_ms,
                           countIf(stop_reason = 'provider_error') / count() AS error_rate,
                           countIf(attempt > 1) / count() AS retried,
                           countIf(stop_reason = 'max_output_tokens') / count() AS max_output,
                           countIf(stop_reason = 'content_filter') / count() AS filtered
                    FROM turns
                    WHERE {_TURNS}
                    GROUP BY provider, model
                ) AS t
                LEFT JOIN (
                    SELECT ifNull(provider, '?') AS provider, ifNull(model, '?') AS model,
                           count() AS failed,
                           arrayStringConcat(arraySort(groupUniqArray(failure_class)), ', ')
                               AS classes
                    FROM (
                        SELECT {_RUN_TIME} AS at, failure_class, provider, model, tenant_id
                        FROM runs
                    )
                    WHERE failure_class IS NOT NULL AND $__timeFilter(at) AND {TENANT_FILTER}
                      AND {PROVIDER_FILTER}
                    GROUP BY provider, model
                ) AS r ON r.provider = t.provider AND r.model = t.model
                ORDER BY attempts DESC
                """
            ),
            field_units={
                "p50_ms": "ms",
                "p95_ms": "ms",
                "p99_ms": "ms",
                "error_rate": "percentunit",
                "retried": "percentunit",
                "max_output": "percentunit",
                "filtered": "percentunit",
            },
        )
    )
    return b.build()
