"""Cost by agent, user, session and run: the cost dashboard's variables and run panels.

Usage rows carry the tenant but not the agent, user or session: those are the run's, so
the filters and the breakdowns join ``billing_usage`` to ``runs`` on ``run_id``. As in the
rest of the cost dashboard, *billable* means reported usage; estimates are shown apart and
never priced, and superseded estimates are left out.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import table

from prism.dashboards._panels import (
    CURRENCY,
    TENANT_FILTER,
    Board,
    ch,
    currency_filter,
    query_variable,
    selected,
    table_panel,
    tenant_filter,
    timeseries_panel,
)

__all__ = ["RUN_VARIABLES", "add_run_panels", "add_run_variables", "run_scope", "runs_filter"]

# variable -> the runs column it selects on
RUN_VARIABLES = {"agent": "agent_id", "user": "user_id", "session": "session_id"}
_EXPLORER_LINK = (
    "Explore this run",
    "/d/prism-run-explorer?${__url_time_range}&var-tenant=All&var-run_id=${__value.raw}",
)


def runs_filter(prefix: str = "") -> str:
    """A filter on runs (``prefix`` + agent_id, ...): the chosen agents, users, sessions."""
    return " AND ".join(
        f"$__conditionalAll({selected(prefix + column, name)}, ${name})"
        for name, column in RUN_VARIABLES.items()
    )


def run_scope(run_id: str = "run_id") -> str:
    """Rows whose run is of the chosen agents, users and sessions (1=1 when all are All)."""
    return " AND ".join(
        f"$__conditionalAll({run_id} IN (SELECT run_id FROM runs WHERE "
        f"{selected(column, name)}), ${name})"
        for name, column in RUN_VARIABLES.items()
    )


# Each counting usage row with its run's agent, user, session and status.
_SCOPED = f"""(
    SELECT u.run_id AS run_id, u.tenant_id AS tenant_id, u.model AS model,
           u.recorded_at AS recorded_at, u.estimated AS estimated, u.cost AS cost,
           u.currency AS currency,
           ifNull(u.total_tokens, ifNull(u.input_tokens, 0) + ifNull(u.output_tokens, 0))
               AS tokens,
           r.agent_id AS agent_id, r.user_id AS user_id, r.session_id AS session_id,
           r.status AS status
    FROM billing_usage AS u
    LEFT JOIN runs AS r ON r.run_id = u.run_id
    WHERE NOT u.superseded AND $__timeFilter(u.recorded_at) AND {tenant_filter("u.tenant_id")}
)"""
_WHERE = runs_filter()


def add_run_variables(b: Board) -> None:
    """The agent, user and session filters (multi-select with All), from runs in range."""
    for name, column in RUN_VARIABLES.items():
        b.variable(
            query_variable(
                name,
                name.capitalize(),
                f"""
                SELECT {column} FROM runs
                WHERE {column} IS NOT NULL AND $__timeFilter(last_event_at) AND {TENANT_FILTER}
                GROUP BY {column}
                ORDER BY max(last_event_at) DESC
                LIMIT 1000
                """,
                f"{name.capitalize()}s of the selected tenants' runs in the time range, the "
                f"1000 most recent (All = no {name} filter)",
                include_all=True,
                multi=True,
            )
        )


def _breakdown(name: str, column: str, limit: int) -> table.Panel:
    return table_panel(
        f"Cost by {name}",
        f"Per {name} and currency over the time range: runs, billable (reported) tokens, "
        f"estimated tokens (never priced) and reported cost; the {limit} most expensive of "
        "each currency, ranked within their currency.",
        "short",
        ch(
            f"""
            SELECT ifNull({column}, '(none)') AS {name}, ifNull(currency, '') AS currency,
                   uniq(run_id) AS runs, sumIf(tokens, NOT estimated) AS billable,
                   sumIf(tokens, estimated) AS estimated_tokens,
                   toFloat64(sum(cost)) AS reported_cost
            FROM {_SCOPED}
            WHERE {_WHERE}
            GROUP BY {name}, currency
            ORDER BY currency, reported_cost DESC, billable DESC
            LIMIT {limit} BY currency
            """
        ),
        w=8,
        field_units={"reported_cost": "none"},
    )


def add_run_panels(b: Board) -> None:
    """Cost by agent, user and session, the most expensive runs, cost per successful run."""
    b.row("By agent, user, session and run")
    b.add(
        _breakdown("agent", "agent_id", 50),
        _breakdown("user", "user_id", 50),
        _breakdown("session", "session_id", 50),
    )
    b.add(
        table_panel(
            "Top 20 most expensive runs",
            "The 20 runs with the highest reported cost in the time range in each currency, "
            "ranked within their currency, with their agent, user, model and outcome. Click a "
            "run id to open it in the run explorer.",
            "short",
            ch(
                f"""
                SELECT run_id, any(tenant_id) AS tenant, any(agent_id) AS agent,
                       any(user_id) AS user, any(model) AS model, any(status) AS status,
                       ifNull(currency, '') AS currency,
                       toFloat64(sum(cost)) AS reported_cost,
                       sumIf(tokens, NOT estimated) AS billable,
                       sumIf(tokens, estimated) AS estimated_tokens
                FROM {_SCOPED}
                WHERE cost IS NOT NULL AND {_WHERE}
                GROUP BY run_id, currency
                ORDER BY currency, reported_cost DESC
                LIMIT 20 BY currency
                """
            ),
            field_units={"reported_cost": "none"},
            field_links={"run_id": _EXPLORER_LINK},
        )
    )
    b.add(
        table_panel(
            "Cost per successful run by agent",
            "Per agent and currency: reported cost of all its runs divided by its succeeded "
            "runs (what one success costs, failures' spend included), beside the average "
            "cost of a succeeded run and the success rate.",
            "short",
            ch(
                f"""
                SELECT ifNull(agent_id, '(none)') AS agent, ifNull(currency, '') AS currency,
                       uniq(run_id) AS runs, uniqIf(run_id, status = 'succeeded') AS succeeded,
                       succeeded / runs AS success_rate,
                       toFloat64(sum(cost)) AS reported_cost,
                       reported_cost / nullIf(succeeded, 0) AS cost_per_success,
                       toFloat64(sumIf(cost, status = 'succeeded')) / nullIf(succeeded, 0)
                           AS avg_success_cost
                FROM {_SCOPED}
                WHERE cost IS NOT NULL AND {_WHERE}
                GROUP BY agent, currency
                ORDER BY currency, reported_cost DESC
                """
            ),
            w=12,
            field_units={
                "success_rate": "percentunit",
                "reported_cost": "none",
                "cost_per_success": "none",
                "avg_success_cost": "none",
            },
        ),
        timeseries_panel(
            "Cost per successful run ($currency)",
            "Per interval, in one currency (one panel per currency): reported cost divided "
            "by the succeeded runs that recorded usage in that interval.",
            "none",
            [
                ch(
                    f"""
                    SELECT $__timeInterval(recorded_at) AS time,
                           toFloat64(sum(cost)) / nullIf(uniqIf(run_id, status = 'succeeded'), 0)
                               AS cost_per_success
                    FROM {_SCOPED}
                    WHERE cost IS NOT NULL AND {_WHERE} AND {currency_filter()}
                    GROUP BY time
                    ORDER BY time
                    """
                )
            ],
            repeat=CURRENCY,
        ),
    )
    b.add(
        timeseries_panel(
            "Estimated share trend by tenant",
            "Share of each interval's provider_turn tokens that are estimates, per tenant: a "
            "rising line means a runtime stopped reporting usage.",
            "percentunit",
            [
                ch(
                    f"""
                    SELECT $__timeInterval(recorded_at) AS time,
                           ifNull(tenant_id, '(none)') AS tenant,
                           sumIf(tokens, estimated) / nullIf(sum(tokens), 0) AS estimated_share
                    FROM {_SCOPED}
                    WHERE {_WHERE}
                    GROUP BY time, tenant
                    ORDER BY time, tenant
                    """
                )
            ],
            w=24,
        )
    )
