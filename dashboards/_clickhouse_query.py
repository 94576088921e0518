"""A query of the ``grafana-clickhouse-datasource`` plugin, shaped for grafana-foundation-sdk.

The SDK ships no ClickHouse query type, so this module adds one: ``ClickHouseQuery`` is a
``Dataquery`` variant (``to_json``/``from_json``) and ``ClickHouseQueryBuilder`` is a
``Builder`` of it, so ``Panel.with_target(...)`` and ``alerting.Query.model(...)`` accept it.
``register_clickhouse_variant()`` teaches the SDK's JSON decoder the plugin's type id, so a
dashboard read back with ``Dashboard.from_json`` gets ``ClickHouseQuery`` targets.

The JSON follows the plugin's SQL editor model (v4): ``editorType: "sql"``, ``rawSql``,
``format`` (numeric, the backend's ``sqlutil.FormatQueryOption``: 0 time series, 1 table,
2 logs, 3 traces; 4 is the editor's "auto") and ``queryType`` (``table``, ``timeseries``,
``logs``, ``traces``).
"""

from __future__ import annotations

import enum
import typing

from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog import plugins as cogplugins
from grafana_foundation_sdk.cog import runtime as cogruntime
from grafana_foundation_sdk.cog import variants as cogvariants
from grafana_foundation_sdk.models import dashboard

__all__ = [
    "DATASOURCE_VARIABLE_REF",
    "PLUGIN_ID",
    "ClickHouseQuery",
    "ClickHouseQueryBuilder",
    "QueryFormat",
    "datasource_ref",
    "register_clickhouse_variant",
]

PLUGIN_ID = "grafana-clickhouse-datasource"
DATASOURCE_VARIABLE_REF = "${datasource}"


class QueryFormat(enum.IntEnum):
    """The plugin's numeric ``format`` (how the backend shapes the result frame)."""

    TIME_SERIES = 0
    TABLE = 1
    LOGS = 2
    TRACES = 3
    AUTO = 4


_QUERY_TYPE = {
    QueryFormat.TIME_SERIES: "timeseries",
    QueryFormat.TABLE: "table",
    QueryFormat.LOGS: "logs",
    QueryFormat.TRACES: "traces",
    QueryFormat.AUTO: "table",
}


def datasource_ref(uid: str = DATASOURCE_VARIABLE_REF) -> dashboard.DataSourceRef:
    """A reference to a ClickHouse datasource; by default the dashboard's ``$datasource``."""
    return dashboard.DataSourceRef(type_val=PLUGIN_ID, uid=uid)


class ClickHouseQuery(cogvariants.Dataquery):
    """One SQL query of the ClickHouse plugin (a panel target or an alert-rule model)."""

    ref_id: str
    raw_sql: str
    format: QueryFormat
    query_type: str
    editor_type: str
    datasource: dashboard.DataSourceRef | None
    hide: bool | None

    def __init__(
        self,
        ref_id: str = "",
        raw_sql: str = "",
        format: QueryFormat = QueryFormat.TABLE,
        query_type: str | None = None,
        editor_type: str = "sql",
        datasource: dashboard.DataSourceRef | None = None,
        hide: bool | None = None,
    ) -> None:
        self.ref_id = ref_id
        self.raw_sql = raw_sql
        self.format = QueryFormat(format)
        self.query_type = query_type if query_type is not None else _QUERY_TYPE[self.format]
        self.editor_type = editor_type
        self.datasource = datasource
        self.hide = hide

    def to_json(self) -> dict[str, object]:
        payload: dict[str, object] = {
            "refId": self.ref_id,
            "editorType": self.editor_type,
            "rawSql": self.raw_sql,
            "format": int(self.format),
            "queryType": self.query_type,
        }
        if self.datasource is not None:
            payload["datasource"] = self.datasource
        if self.hide is not None:
            payload["hide"] = self.hide
        return payload

    @classmethod
    def from_json(cls, data: dict[str, typing.Any]) -> typing.Self:
        args: dict[str, typing.Any] = {}
        if "refId" in data:
            args["ref_id"] = data["refId"]
        if "rawSql" in data:
            args["raw_sql"] = data["rawSql"]
        if "format" in data:
            args["format"] = QueryFormat(int(data["format"]))
        if "queryType" in data:
            args["query_type"] = data["queryType"]
        if "editorType" in data:
            args["editor_type"] = data["editorType"]
        if data.get("datasource") is not None:
            args["datasource"] = dashboard.DataSourceRef.from_json(data["datasource"])
        if "hide" in data:
            args["hide"] = data["hide"]
        return cls(**args)


class ClickHouseQueryBuilder(cogbuilder.Builder[ClickHouseQuery]):
    """Builds a ``ClickHouseQuery``; targets ``$datasource`` unless told otherwise.

    Example::

        panel.with_target(
            ClickHouseQueryBuilder("A").raw_sql("SELECT 1").format(QueryFormat.TABLE)
        )
    """

    _internal: ClickHouseQuery

    def __init__(self, ref_id: str = "A") -> None:
        self._internal = ClickHouseQuery(ref_id=ref_id, datasource=datasource_ref())

    def build(self) -> ClickHouseQuery:
        return self._internal

    def ref_id(self, ref_id: str) -> typing.Self:
        self._internal.ref_id = ref_id
        return self

    def raw_sql(self, raw_sql: str) -> typing.Self:
        self._internal.raw_sql = raw_sql
        return self

    def format(self, fmt: QueryFormat) -> typing.Self:
        """Set ``format`` and the matching ``queryType``."""
        self._internal.format = QueryFormat(fmt)
        self._internal.query_type = _QUERY_TYPE[self._internal.format]
        return self

    def query_type(self, query_type: str) -> typing.Self:
        self._internal.query_type = query_type
        return self

    def datasource(self, ref: dashboard.DataSourceRef) -> typing.Self:
        self._internal.datasource = ref
        return self

    def hide(self, hide: bool) -> typing.Self:
        self._internal.hide = hide
        return self


_registered = False


def register_clickhouse_variant() -> None:
    """Register the SDK's default plugins and this query type with the SDK's JSON decoder."""
    global _registered
    if _registered:
        return
    cogplugins.register_default_plugins()
    cogruntime.register_dataquery_variant(
        cogruntime.DataqueryConfig(identifier=PLUGIN_ID, from_json_hook=ClickHouseQuery.from_json)
    )
    _registered = True
