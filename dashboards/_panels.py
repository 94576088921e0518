"""Shared building blocks of the dashboards: variables, panel factories, a board numbering panels.

Every panel and target points at the ``$datasource`` variable (never a fixed uid), every
panel carries a unit and a description, and SQL names the views without a database so
Grafana uses the datasource's default database. ``qualify(sql, database)`` prefixes the
view names for a test ledger in another database.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Mapping, Sequence

from grafana_foundation_sdk.builders import barchart, common, dashboard, stat, table, timeseries
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.models import common as common_models
from grafana_foundation_sdk.models import dashboard as dashboard_models

from prism.dashboards._clickhouse_query import (
    PLUGIN_ID,
    ClickHouseQueryBuilder,
    QueryFormat,
    datasource_ref,
)
from prism.dashboards._errors import DashboardError
from prism.dashboards._palette import OTHER_COLOR, OTHER_SERIES, color_by_name, fixed_color
from prism.sinks import VIEWS  # the ledger names users query

__all__ = [
    "CURRENCY",
    "EVENT_TIME",
    "RECEIVE_TIME",
    "TENANT_FILTER",
    "TOP_SERIES",
    "VIEWS",
    "Board",
    "bars",
    "ch",
    "currency_filter",
    "currency_variable",
    "decoded",
    "dedent_sql",
    "qualify",
    "selected",
    "stat_panel",
    "table_panel",
    "tenant_filter",
    "time_axis",
    "timeseries_panel",
    "top_series",
]


def decoded(variable: str) -> str:
    """SQL for the text of ``variable`` that no value can break out of.

    Grafana's ``singlequote`` and ``sqlstring`` formats leave ``\\`` alone, and ClickHouse
    reads backslash escapes, so ``\\' OR 1=1 --`` escapes their quotes. ``percentencode``
    (RFC 3986, ``'`` and ``\\`` included) leaves only ``[A-Za-z0-9._~%-]`` inside the
    literal, and ClickHouse decodes it back. A multi-value variable arrives as ``{a,b}``.
    """
    return f"decodeURLComponent('${{{variable}:percentencode}}')"


def selected(column: str, variable: str) -> str:
    """``column`` is one of the values selected in the multi-value ``variable``.

    (A value that itself holds a comma matches as its parts: the filter narrows what a
    viewer asked for; the tenant boundary is the Grafana account's row policy.)
    """
    return f"has(splitByChar(',', trim(BOTH '{{}}' FROM {decoded(variable)})), {column})"


def tenant_filter(column: str = "tenant_id") -> str:
    """The tenant filter of a query on ``column``: short-circuits to 1=1 on All.

    No ``$`` in the condition: the plugin splices it with JavaScript's ``String.replace``,
    which would read ``$'`` or ``$&`` as replacement patterns.
    """
    return f"$__conditionalAll({selected(column, 'tenant')}, $tenant)"


# The tenant filter every tenant-scoped query uses.
TENANT_FILTER = tenant_filter()

# The variable money panels repeat over: one panel per currency, never two on one axis.
CURRENCY = "currency"

# The two clocks a time series can be plotted on, as each panel's description names them.
EVENT_TIME = "event time"
RECEIVE_TIME = "receive time"
_AXIS_NOTE = {
    EVENT_TIME: "Plotted by event time (the timestamp the runtime gave the event).",
    RECEIVE_TIME: "Plotted by receive time (when the pipeline received the record).",
}
_SAMPLES_RE = re.compile(r"\bFROM\s+(?:\w+\.)?worker_progress\b")  # the workers' clock
_INTERVAL_RE = re.compile(r"\$__timeInterval(?:_ms)?\(\s*(?:\w+\.)?(\w+)\s*\)")

# Series a stacked chart shows before folding the rest into 'other'.
TOP_SERIES = 8


def time_axis(sqls: Sequence[str]) -> str | None:
    """The clock the queries bucket time by: ``RECEIVE_TIME`` for ``received_at`` (and the
    workers' own samples), ``EVENT_TIME`` otherwise; None when they bucket no time.

    Raises ``DashboardError`` when the queries of one panel mix the two clocks: on replayed
    or late data they lie hours apart and one axis cannot show both.
    """
    kinds = {
        RECEIVE_TIME if col == "received_at" or _SAMPLES_RE.search(sql) else EVENT_TIME
        for sql in sqls
        for col in _INTERVAL_RE.findall(sql)
    }
    if len(kinds) > 1:
        raise DashboardError(
            f"queries plot both {' and '.join(sorted(kinds))} on one time axis; split them "
            "into a panel per clock"
        )
    return kinds.pop() if kinds else None


def top_series(inner: str, value: str, n: int = TOP_SERIES) -> str:
    """``inner``'s (time, series, value) rows with only the ``n`` largest series by total;
    the rest are summed into one series, 'other'. ``value`` names the value column.

    A stacked chart of 28 series cannot be read; the top 8 and the rest can. The value must
    add up (counts, tokens, money of one currency), never a rate or a quantile.
    """
    return f"""
    SELECT time, if(place <= {n}, series, 'other') AS label, sum(value) AS {value}
    FROM (
        SELECT time, series, value, dense_rank() OVER (ORDER BY total DESC, series) AS place
        FROM (
            SELECT time, series, value, sum(value) OVER (PARTITION BY series) AS total
            FROM (
{textwrap.indent(dedent_sql(inner), " " * 16)}
            )
        )
    )
    GROUP BY time, label
    ORDER BY time, label = 'other', label
    """


_VIEW_RE = re.compile(r"\b(FROM|JOIN)\s+(" + "|".join(VIEWS) + r")\b", re.IGNORECASE)


def qualify(sql: str, database: str | None) -> str:
    """Prefix the view names after FROM/JOIN with ``database`` (unchanged when None)."""
    if not database:
        return sql
    return _VIEW_RE.sub(lambda m: f"{m.group(1)} {database}.{m.group(2)}", sql)


def ch(sql: str, ref_id: str = "A", fmt: QueryFormat = QueryFormat.TABLE) -> ClickHouseQueryBuilder:
    """A ClickHouse SQL target on ``$datasource``; the SQL is stripped of outer blank lines."""
    return ClickHouseQueryBuilder(ref_id).raw_sql(dedent_sql(sql)).format(fmt)


def dedent_sql(sql: str) -> str:
    """The SQL without its common indentation, trailing spaces and outer blank lines."""
    lines = [line.rstrip() for line in sql.splitlines()]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    indent = min((len(ln) - len(ln.lstrip()) for ln in lines if ln), default=0)
    return "\n".join(ln[indent:] for ln in lines)


def datasource_variable() -> dashboard.DatasourceVariable:
    """The ``datasource`` variable: any ClickHouse datasource, the provisioned one by default."""
    return (
        dashboard.DatasourceVariable("datasource")
        .label("Datasource")
        .description("ClickHouse datasource holding the prism ledger")
        .type(PLUGIN_ID)
        .regex("")
    )


def query_variable(
    name: str,
    label: str,
    sql: str,
    description: str,
    *,
    include_all: bool,
    multi: bool,
) -> dashboard.QueryVariable:
    """A query variable on ``$datasource`` that refreshes when the time range changes.

    Its values are only what its query returns: no custom values (typed or from the URL).
    """
    var = (
        dashboard.QueryVariable(name)
        .label(label)
        .description(description)
        .datasource(datasource_ref())
        .query(dedent_sql(sql))
        .refresh(dashboard_models.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dashboard_models.VariableSort.ALPHABETICAL_ASC)
        .multi(multi)
        .include_all(include_all)
        .allow_custom_value(False)
    )
    if include_all:
        var = var.current(dashboard_models.VariableOption(text=["All"], value=["$__all"]))
    return var


def tenant_variable() -> dashboard.QueryVariable:
    """The ``tenant`` filter: multi-select with All, options from runs in the time range."""
    return query_variable(
        "tenant",
        "Tenant",
        """
        SELECT DISTINCT tenant_id FROM runs
        WHERE tenant_id IS NOT NULL AND $__timeFilter(last_event_at)
        ORDER BY tenant_id
        """,
        "Tenants with run activity in the time range (All = no tenant filter)",
        include_all=True,
        multi=True,
    )


def currency_variable() -> dashboard.QueryVariable:
    """The ``currency`` variable money panels repeat over: currencies priced in the range."""
    return query_variable(
        CURRENCY,
        "Currency",
        f"""
        SELECT DISTINCT ifNull(currency, '') AS currency FROM billing_usage
        WHERE cost IS NOT NULL AND $__timeFilter(recorded_at) AND {TENANT_FILTER}
        ORDER BY currency
        """,
        "Currencies of priced usage in the time range; money panels repeat per currency, "
        "since amounts in two currencies never add up",
        include_all=True,
        multi=True,
    )


def currency_filter(column: str = "currency") -> str:
    """Rows of the one currency a repeated money panel shows."""
    return selected(f"ifNull({column}, '')", CURRENCY)


def _thresholds(steps: Sequence[tuple[float | None, str]]) -> dashboard.ThresholdsConfig:
    return (
        dashboard.ThresholdsConfig()
        .mode(dashboard_models.ThresholdsMode.ABSOLUTE)
        .steps([dashboard_models.Threshold(value=v, color=c) for v, c in steps])
    )


def _common(
    panel: timeseries.Panel | stat.Panel | table.Panel | barchart.Panel,
    title: str,
    description: str,
    unit: str,
    w: int,
    h: int,
) -> None:
    panel.title(title).description(description).unit(unit).datasource(datasource_ref())
    panel.span(w).height(h)


def timeseries_panel(
    title: str,
    description: str,
    unit: str,
    targets: Sequence[ClickHouseQueryBuilder],
    *,
    w: int = 12,
    h: int = 8,
    stacked: bool = False,
    bars_style: bool = False,
    colors: Mapping[str, str] | None = None,
    repeat: str | None = None,
) -> timeseries.Panel:
    """A time-series panel; its targets should return (time, [labels...], value) rows.

    The description gets a sentence naming the clock the x axis shows (``time_axis``);
    ``colors`` fixes series colours by name ('other' is always grey); ``repeat`` repeats
    the panel for each value of that variable (``CURRENCY`` for money).
    """
    axis = time_axis([str(t.build().raw_sql) for t in targets])
    if axis:
        description = f"{description} {_AXIS_NOTE[axis]}"
    panel = timeseries.Panel()
    _common(panel, title, description, unit, w, h)
    for target in targets:
        panel.with_target(target.format(QueryFormat.TIME_SERIES))
    color_by_name(panel, colors or {})
    if any("'other'" in str(t.build().raw_sql) for t in targets):
        # Grafana names a long-format series '<value column> <label>', e.g. 'tokens other'
        panel.override_by_regexp(OTHER_SERIES, [fixed_color(OTHER_COLOR)])
    if repeat:
        _repeat(panel, repeat)
    panel.legend(
        common.VizLegendOptions()
        .display_mode(common_models.LegendDisplayMode.LIST)
        .placement(common_models.LegendPlacement.BOTTOM)
        .show_legend(True)
    )
    panel.fill_opacity(20 if stacked else 10)
    if stacked:
        panel.stacking(common.StackingConfig().mode(common_models.StackingMode.NORMAL))
    if bars_style:
        panel.draw_style(common_models.GraphDrawStyle.BARS)
    return panel


def stat_panel(
    title: str,
    description: str,
    unit: str,
    target: ClickHouseQueryBuilder,
    *,
    w: int = 6,
    h: int = 4,
    thresholds: Sequence[tuple[float | None, str]] = ((None, "green"),),
    decimals: int | None = None,
) -> stat.Panel:
    """A single-value panel over a table-format query."""
    panel = stat.Panel()
    _common(panel, title, description, unit, w, h)
    panel.with_target(target.format(QueryFormat.TABLE))
    panel.thresholds(_thresholds(thresholds))
    panel.graph_mode(common_models.BigValueGraphMode.NONE)
    panel.color_mode(common_models.BigValueColorMode.VALUE)
    if decimals is not None:
        panel.decimals(decimals)
    return panel


def table_panel(
    title: str,
    description: str,
    unit: str,
    target: ClickHouseQueryBuilder,
    *,
    w: int = 24,
    h: int = 9,
    field_units: Mapping[str, str] | None = None,
    field_links: Mapping[str, tuple[str, str]] | None = None,
    repeat: str | None = None,
) -> table.Panel:
    """A table panel over a table-format query.

    ``field_units`` overrides the unit of single columns; ``field_links`` maps a column to
    a (title, url) data link (Grafana interpolates ``${__value.raw}`` and variables).
    """
    panel = table.Panel()
    _common(panel, title, description, unit, w, h)
    panel.with_target(target.format(QueryFormat.TABLE))
    panel.filterable(True)
    for name, field_unit in (field_units or {}).items():
        panel.override_by_name(
            name, [dashboard_models.DynamicConfigValue(id_val="unit", value=field_unit)]
        )
    for name, (link_title, url) in (field_links or {}).items():
        link = {"title": link_title, "url": url, "targetBlank": False}
        panel.override_by_name(
            name, [dashboard_models.DynamicConfigValue(id_val="links", value=[link])]
        )
    if repeat:
        _repeat(panel, repeat)
    return panel


def _repeat(panel: timeseries.Panel | table.Panel, variable: str) -> None:
    """One copy of the panel per selected value of ``variable``: charts side by side, two
    to a row; tables one under the other, at full width, so no column is cut off."""
    if isinstance(panel, table.Panel):
        panel.repeat(variable).repeat_direction("v")
    else:
        panel.repeat(variable).repeat_direction("h").max_per_row(2)


def bars(
    title: str,
    description: str,
    unit: str,
    target: ClickHouseQueryBuilder,
    *,
    w: int = 12,
    h: int = 8,
) -> barchart.Panel:
    """A bar chart of a table-format query whose first string column is the category."""
    panel = barchart.Panel()
    _common(panel, title, description, unit, w, h)
    panel.with_target(target.format(QueryFormat.TABLE))
    panel.show_value(common_models.VisibilityMode.AUTO)
    # Spelled out so the JSON reads back through the SDK unchanged (its decoder fills these).
    panel.fill_opacity(80).gradient_mode(common_models.GraphGradientMode.NONE).line_width(1)
    return panel


class Board:
    """A dashboard with the ``datasource`` and ``tenant`` variables; numbers panels in order.

    Example::

        board = Board("prism-sre", "Prism / SRE overview", "...", database=None)
        board.row("Throughput").add(timeseries_panel(...))
        model = board.build()
    """

    def __init__(
        self,
        uid: str,
        title: str,
        description: str,
        *,
        database: str | None = None,
        tags: Sequence[str] = ("prism",),
        time_from: str = "now-6h",
    ) -> None:
        self.database = database
        self._next_id = 1
        self._builder = (
            dashboard.Dashboard(title)
            .uid(uid)
            .description(description)
            .tags(list(tags))
            .editable()
            .timezone("utc")
            .refresh("1m")
            .time(time_from, "now")
            .tooltip(dashboard_models.DashboardCursorSync.CROSSHAIR)
            .with_variable(datasource_variable())
            .with_variable(tenant_variable())
        )

    def variable(self, variable: cogbuilder.Builder[dashboard_models.VariableModel]) -> Board:
        self._builder.with_variable(variable)
        return self

    def row(self, title: str) -> Board:
        self._builder.with_row(dashboard.Row(title).id(self._take_id()))
        return self

    def add(self, *panels: cogbuilder.Builder[dashboard_models.Panel]) -> Board:
        for panel in panels:
            built = panel.build()
            built.id_val = self._take_id()
            self._builder.with_panel(_Built(built))
        return self

    def _take_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def build(self) -> dashboard_models.Dashboard:
        """The SDK model, with every query qualified for ``database`` when one was given."""
        model = self._builder.build()
        if self.database:
            for variable in model.templating.list_val or []:
                if isinstance(variable.query, str):
                    variable.query = qualify(variable.query, self.database)
            for panel in model.panels or []:
                for target in getattr(panel, "targets", None) or []:
                    if hasattr(target, "raw_sql"):
                        target.raw_sql = qualify(target.raw_sql, self.database)
        return model


class _Built(cogbuilder.Builder[dashboard_models.Panel]):
    """Wraps an already-built panel so ``Dashboard.with_panel`` can lay it out."""

    def __init__(self, panel: dashboard_models.Panel) -> None:
        self._panel = panel

    def build(self) -> dashboard_models.Panel:
        return self._panel
