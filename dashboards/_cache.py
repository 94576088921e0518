"""The cache efficiency dashboard, from the per-minute aggregates in ``cache_hits_1m``.

Hit rates are token-weighted and re-aggregated from token sums: cache reads over the input
tokens of the turns that report cache reads, never an average of per-minute rates. Turns
that report no cache fields are counted apart (absent is not zero, CONTRACT.md rule 7).
"""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dashboard_models

from prism.dashboards._panels import (
    TENANT_FILTER,
    TOP_SERIES,
    Board,
    ch,
    stat_panel,
    table_panel,
    timeseries_panel,
    top_series,
)

__all__ = ["UID", "cache_efficiency"]

UID = "prism-cache-efficiency"

_WHERE = f"$__timeFilter(minute) AND {TENANT_FILTER}"
HIT_RATE = "sum(cache_read_tokens) / nullIf(sum(input_tokens_reporting_cache), 0)"


def cache_efficiency(database: str | None = None) -> dashboard_models.Dashboard:
    """Prompt-cache hit rate, cache writes and turns without cache reports.

    Example::

        model = cache_efficiency()
    """
    b = Board(
        UID,
        "Prism / Cache efficiency",
        "Prompt-cache efficiency by provider and model: token-weighted hit rate, cache "
        "write tokens, and the turns that report no cache fields at all.",
        database=database,
        tags=("prism", "cache"),
    )
    b.add(
        stat_panel(
            "Cache hit rate",
            "Token-weighted hit rate over the time range: cache read tokens / input tokens "
            "of the turns that report cache reads.",
            "percentunit",
            ch(f"SELECT {HIT_RATE} AS hit_rate FROM cache_hits_1m WHERE {_WHERE}"),
            decimals=1,
        ),
        stat_panel(
            "Cache read tokens",
            "Input tokens served from the prompt cache in the time range.",
            "short",
            ch(f"SELECT sum(cache_read_tokens) AS read_tokens FROM cache_hits_1m WHERE {_WHERE}"),
        ),
        stat_panel(
            "Cache write tokens",
            "Tokens written to the prompt cache in the time range.",
            "short",
            ch(f"SELECT sum(cache_write_tokens) AS write_tokens FROM cache_hits_1m WHERE {_WHERE}"),
        ),
        stat_panel(
            "Turns without cache reports",
            "Share of provider turns in the time range that report no cache fields; their "
            "tokens are left out of the hit rate instead of counting as misses.",
            "percentunit",
            ch(
                f"""
                SELECT sum(turns_not_reporting_cache) / nullIf(sum(turns), 0) AS unreported_share
                FROM cache_hits_1m
                WHERE {_WHERE}
                """
            ),
            thresholds=((None, "green"), (0.25, "orange")),
            decimals=1,
        ),
    )
    b.add(
        timeseries_panel(
            "Hit rate by provider / model",
            "Token-weighted cache hit rate per interval for each provider / model, summed "
            "from the per-minute token totals.",
            "percentunit",
            [
                ch(
                    f"""
                    SELECT $__timeInterval(minute) AS time,
                           concat(provider, ' / ', model) AS series,
                           {HIT_RATE} AS hit_rate
                    FROM cache_hits_1m
                    WHERE {_WHERE}
                    GROUP BY time, series
                    ORDER BY time, series
                    """
                )
            ],
            w=24,
        )
    )
    b.add(
        timeseries_panel(
            "Cache write tokens by provider / model",
            f"Tokens written to the prompt cache per interval for each provider / model: the "
            f"{TOP_SERIES} largest over the range, the rest summed as 'other'.",
            "short",
            [
                ch(
                    top_series(
                        f"""
                        SELECT $__timeInterval(minute) AS time,
                               concat(provider, ' / ', model) AS series,
                               sum(cache_write_tokens) AS value
                        FROM cache_hits_1m
                        WHERE {_WHERE}
                        GROUP BY time, series
                        """,
                        "write_tokens",
                    )
                )
            ],
            stacked=True,
        ),
        timeseries_panel(
            "Turns without cache reports by provider / model",
            f"Provider turns per interval that report no cache read tokens, per provider / "
            f"model: the {TOP_SERIES} largest over the range, the rest summed as 'other'.",
            "short",
            [
                ch(
                    top_series(
                        f"""
                        SELECT $__timeInterval(minute) AS time,
                               concat(provider, ' / ', model) AS series,
                               sum(turns_not_reporting_cache) AS value
                        FROM cache_hits_1m
                        WHERE {_WHERE}
                        GROUP BY time, series
                        """,
                        "unreported_turns",
                    )
                )
            ],
            stacked=True,
            bars_style=True,
        ),
    )
    b.add(
        table_panel(
            "Cache summary by provider / model",
            "Per provider / model over the time range: turns, turns reporting cache, input "
            "and cache tokens, and the token-weighted hit rate.",
            "short",
            ch(
                f"""
                SELECT provider, model,
                       sum(turns) AS all_turns,
                       sum(turns_reporting_cache) AS reporting,
                       sum(turns_not_reporting_cache) AS not_reporting,
                       sum(input_tokens) AS input,
                       sum(input_tokens_reporting_cache) AS input_reporting,
                       sum(cache_read_tokens) AS cache_read,
                       sum(cache_write_tokens) AS cache_write,
                       {HIT_RATE} AS hit_rate
                FROM cache_hits_1m
                WHERE {_WHERE}
                GROUP BY provider, model
                ORDER BY input DESC
                """
            ),
            field_units={"hit_rate": "percentunit"},
        )
    )
    return b.build()
