"""The cost and usage dashboard: billable provider_turn tokens and cost, estimates, mismatches.

Everything reads ``billing_usage`` (provider_turn rows only; ``run_total`` never reaches
billing) without superseded estimates, since reported usage wins over an estimate of the
same turn. *Billable* means reported usage; estimates that stand alone are shown apart, with
their confidence, and are never priced (CONTRACT.md rules 5 and 6).
"""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dashboard_models

from prism.dashboards._budgets import budget_panel
from prism.dashboards._cost_runs import (
    add_run_panels,
    add_run_variables,
    run_scope,
    runs_filter,
)
from prism.dashboards._panels import (
    CURRENCY,
    TENANT_FILTER,
    TOP_SERIES,
    Board,
    ch,
    currency_filter,
    currency_variable,
    stat_panel,
    table_panel,
    tenant_filter,
    timeseries_panel,
    top_series,
)

__all__ = ["UID", "cost_and_usage"]

UID = "prism-cost-usage"

# Tokens of one usage row: total when reported, else input + output.
TOKENS = "ifNull(total_tokens, ifNull(input_tokens, 0) + ifNull(output_tokens, 0))"


# provider_turn usage that counts: no superseded estimate, in range, of the chosen tenants
# (and, with the run filters, of the chosen agents, users and sessions).
def _usage(run_filters: bool) -> str:
    base = f"NOT superseded AND $__timeFilter(recorded_at) AND {TENANT_FILTER}"
    return f"{base} AND {run_scope()}" if run_filters else base


_USAGE = _usage(run_filters=False)  # what the report (tenant filter only) reuses
_BILLABLE = f"NOT estimated AND {_USAGE}"


def cost_and_usage(
    database: str | None = None, *, run_filters: bool = True
) -> dashboard_models.Dashboard:
    """Billable tokens and cost by tenant, model, agent, user, session and run; estimates.

    Example::

        model = cost_and_usage()
        model = cost_and_usage(run_filters=False)  # tenant filter only (the report)
    """
    usage = _usage(run_filters)
    billable = f"NOT estimated AND {usage}"
    scope = f" AND {runs_filter()}" if run_filters else ""
    r_scope = f" AND {runs_filter('r.')}" if run_filters else ""
    b = Board(
        UID,
        "Prism / Cost and usage",
        "Billable provider_turn tokens and reported cost by tenant and model, agent, user, "
        "session and run, cost per successful run, the share of usage that is estimated "
        "(and with what confidence), and runs whose run_total disagrees with their "
        "provider turns.",
        database=database,
        tags=("prism", "billing"),
        time_from="now-24h",
    )
    if run_filters:
        add_run_variables(b)
    b.variable(currency_variable())
    b.add(
        stat_panel(
            "Billable tokens",
            "Tokens of reported provider_turn usage in the time range (total, else input + "
            "output); estimates are not billable.",
            "short",
            ch(f"SELECT sum({TOKENS}) AS billable_tokens FROM billing_usage WHERE {billable}"),
        ),
        stat_panel(
            "Estimated share of provider-turn tokens",
            "Share of provider_turn tokens that are estimates (turns with no reported usage), "
            "superseded estimates excluded. Estimates are never priced.",
            "percentunit",
            ch(
                f"""
                SELECT sumIf({TOKENS}, estimated) / nullIf(sum({TOKENS}), 0) AS estimated_share
                FROM billing_usage
                WHERE {usage}
                """
            ),
            thresholds=((None, "green"), (0.05, "orange"), (0.2, "red")),
            decimals=1,
        ),
        stat_panel(
            "Runs with a run_total mismatch",
            "Runs whose run_total token counts differ from the sum of their provider_turn "
            "rows (the run record's usage_mismatch flag), by last event in the time range.",
            "short",
            ch(
                f"""
                SELECT countIf(usage_mismatch) AS mismatched_runs
                FROM runs
                WHERE $__timeFilter(last_event_at) AND {TENANT_FILTER}{scope}
                """
            ),
            thresholds=((None, "green"), (1, "orange")),
        ),
        stat_panel(
            "Priced usage rows",
            "Reported provider_turn rows that carry a cost, in the time range.",
            "short",
            ch(
                f"""
                SELECT countIf(cost IS NOT NULL) AS priced_rows
                FROM billing_usage
                WHERE {billable}
                """
            ),
        ),
    )
    b.add(
        timeseries_panel(
            "Billable tokens by tenant and model",
            f"Billable provider_turn tokens per interval, one series per tenant / model: the "
            f"{TOP_SERIES} largest over the range, the rest summed as 'other'.",
            "short",
            [
                ch(
                    top_series(
                        f"""
                        SELECT $__timeInterval(recorded_at) AS time,
                               concat(ifNull(tenant_id, '(none)'), ' / ', ifNull(model, '(none)'))
                                   AS series,
                               sum({TOKENS}) AS value
                        FROM billing_usage
                        WHERE {billable}
                        GROUP BY time, series
                        """,
                        "tokens",
                    )
                )
            ],
            w=24,
            stacked=True,
        )
    )
    b.add(
        timeseries_panel(
            "Reported cost by tenant and model ($currency)",
            f"Cost of reported provider_turn usage per interval in one currency (one panel "
            f"per currency: amounts in two currencies never add up), one series per tenant / "
            f"model: the {TOP_SERIES} largest over the range, the rest summed as 'other'.",
            "none",
            [
                ch(
                    top_series(
                        f"""
                        SELECT $__timeInterval(recorded_at) AS time,
                               concat(ifNull(tenant_id, '(none)'), ' / ', ifNull(model, '(none)'))
                                   AS series,
                               toFloat64(sum(cost)) AS value
                        FROM billing_usage
                        WHERE cost IS NOT NULL AND {billable} AND {currency_filter()}
                        GROUP BY time, series
                        """,
                        "reported_cost",
                    )
                )
            ],
            w=24,
            stacked=True,
            repeat=CURRENCY,
        ),
        timeseries_panel(
            "Estimated share by confidence",
            "Share of each interval's provider_turn tokens that are estimates, by the "
            "estimate's confidence (medium, low; 'unspecified' when the runtime gave none).",
            "percentunit",
            [
                ch(
                    f"""
                    SELECT time, confidence, tokens / nullIf(interval_tokens, 0) AS share
                    FROM (
                        SELECT $__timeInterval(recorded_at) AS time,
                               if(estimated, ifNull(confidence, 'unspecified'), 'reported')
                                   AS confidence,
                               sum({TOKENS}) AS tokens,
                               sum(sum({TOKENS})) OVER (PARTITION BY time) AS interval_tokens
                        FROM billing_usage
                        WHERE {usage}
                        GROUP BY time, confidence
                    )
                    WHERE confidence != 'reported'
                    ORDER BY time, confidence
                    """
                )
            ],
            stacked=True,
        ),
    )
    b.add(
        table_panel(
            "Billable usage by tenant and model",
            "Billable (reported) provider_turn tokens and cost in the time range per tenant, "
            "provider, model and currency, and the estimated tokens beside them (never priced).",
            "short",
            ch(
                f"""
                SELECT ifNull(tenant_id, '(none)') AS tenant,
                       ifNull(provider, '(none)') AS provider,
                       ifNull(model, '(none)') AS model, ifNull(currency, '') AS currency,
                       sumIf(ifNull(input_tokens, 0), NOT estimated) AS input,
                       sumIf(ifNull(output_tokens, 0), NOT estimated) AS output,
                       sumIf(ifNull(cache_read_tokens, 0), NOT estimated) AS cache_read,
                       sumIf(ifNull(cache_write_tokens, 0), NOT estimated) AS cache_write,
                       sumIf({TOKENS}, NOT estimated) AS billable,
                       sumIf({TOKENS}, estimated) AS estimated_tokens,
                       toFloat64(sum(cost)) AS reported_cost
                FROM billing_usage
                WHERE {usage}
                GROUP BY tenant, provider, model, currency
                ORDER BY billable DESC
                """
            ),
            field_units={"reported_cost": "none"},
        )
    )
    b.add(
        table_panel(
            "run_total mismatches",
            "Runs flagged usage_mismatch: their run_total usage differs from the sum of their "
            "billable provider_turn rows. Billing uses the provider_turn rows.",
            "short",
            ch(
                f"""
                SELECT r.run_id AS run_id, r.tenant_id AS tenant_id, r.model AS model,
                       r.last_event_at AS last_event_at,
                       t.run_total_tokens AS run_total_tokens,
                       p.provider_turn_tokens AS provider_turn_tokens,
                       toInt64(t.run_total_tokens) - toInt64(p.provider_turn_tokens) AS difference
                FROM runs AS r
                LEFT JOIN (
                    SELECT run_id, sum({TOKENS}) AS run_total_tokens
                    FROM usage
                    WHERE scope = 'run_total'
                    GROUP BY run_id
                ) AS t ON t.run_id = r.run_id
                LEFT JOIN (
                    SELECT run_id, sum({TOKENS}) AS provider_turn_tokens
                    FROM billing_usage
                    WHERE NOT superseded
                    GROUP BY run_id
                ) AS p ON p.run_id = r.run_id
                WHERE r.usage_mismatch AND $__timeFilter(r.last_event_at)
                  AND {tenant_filter("r.tenant_id")}{r_scope}
                ORDER BY r.last_event_at DESC
                LIMIT 200
                """
            ),
            field_units={"last_event_at": "dateTimeAsIso"},
        )
    )
    b.add(budget_panel())
    if run_filters:
        add_run_panels(b)
    return b.build()
