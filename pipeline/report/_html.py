"""The report page: one self-contained HTML document (inline CSS and SVG, no script, no network).

Each panel is a ``<figure class="panel">`` carrying ``data-kind``, ``data-rows`` (rows its
queries returned) and, when a query failed, ``data-error``; its expanded SQL sits under a
``<details>`` element. Every string from the ledger is escaped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from html import escape
from typing import Any

from prism.dashboards import OTHER_COLOR, TimeRange

from ._data import PanelResult, categories, fold_series, series_of, stat_value
from ._svg import bars_svg, color, format_value, timeseries_svg

__all__ = ["PageMeta", "render_page"]

_MAX_LEGEND = 16
_MAX_CELL = 120
_MAX_ROWS = 25  # table rows shown; the SQL under the panel lists them all

_CSS = """
:root { --fg: #1f2328; --muted: #59636e; --line: #d1d9e0; --bg: #f6f8fa; }
* { box-sizing: border-box; }
body { margin: 0; padding: 24px 28px 40px; font: 14px/1.45 system-ui, -apple-system, "Segoe UI",
  Roboto, "DejaVu Sans", sans-serif; color: var(--fg); background: var(--bg); }
header h1 { margin: 0 0 4px; font-size: 22px; }
header p { margin: 2px 0; color: var(--muted); }
.grid { display: grid; grid-template-columns: repeat(24, minmax(0, 1fr)); gap: 14px; }
h2 { grid-column: 1 / -1; margin: 18px 0 0; font-size: 16px; border-bottom: 1px solid var(--line);
  padding-bottom: 4px; }
.panel { margin: 0; background: #fff; border: 1px solid var(--line); border-radius: 6px;
  padding: 10px 12px; min-width: 0; }
.panel figcaption { font-weight: 600; }
.panel .desc { margin: 2px 0 8px; color: var(--muted); font-size: 12px; }
.stat .value { font-size: 30px; font-weight: 600; color: #1f78c1; margin-top: 4px; }
svg text { font-size: 11px; fill: var(--muted); }
svg .grid { stroke: #e6eaef; stroke-width: 1; }
svg text.value { fill: var(--fg); font-size: 10px; }
.legend { display: flex; flex-wrap: wrap; gap: 4px 14px; margin-top: 6px; font-size: 12px; }
.legend .axis { margin-left: auto; color: var(--muted); }
.legend span::before { content: ""; display: inline-block; width: 10px; height: 10px;
  margin-right: 5px; border-radius: 2px; background: var(--c); vertical-align: -1px; }
table { border-collapse: collapse; width: 100%; font-size: 12px; }
th, td { text-align: left; padding: 3px 8px; border-bottom: 1px solid #eef1f4;
  white-space: nowrap; overflow: hidden; text-overflow: ellipsis; max-width: 420px; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.scroll { overflow-x: auto; }
.nodata { color: var(--muted); font-style: italic; }
.error { color: #b42318; }
details { margin-top: 6px; font-size: 12px; color: var(--muted); }
pre { white-space: pre-wrap; background: var(--bg); padding: 8px; border-radius: 4px; }
footer { margin-top: 24px; color: var(--muted); font-size: 12px; }
"""


@dataclass(frozen=True, slots=True)
class PageMeta:
    """What the page says about itself: where the data came from and for which range."""

    ledger: str  # the DSN, password redacted
    database: str
    start: datetime
    end: datetime
    interval: timedelta
    tenants: Sequence[str]
    generated_at: datetime
    source: str  # where the panel definitions live
    axes: Mapping[str, TimeRange] = field(default_factory=dict)  # each clock's range


def _cell(value: Any, unit: str | None) -> tuple[str, bool]:
    """(escaped text, numeric?) of one table cell."""
    if value is None:
        return "-", False
    if isinstance(value, datetime):
        v = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
        return v.strftime("%Y-%m-%d %H:%M:%S"), False
    if isinstance(value, date):
        return value.isoformat(), False
    if isinstance(value, bool):
        return str(value).lower(), False
    if isinstance(value, int | float | Decimal):
        return escape(format_value(float(value), unit or "short", exact=True)), True
    text = str(value)
    if len(text) > _MAX_CELL:
        return f'<span title="{escape(text)}">{escape(text[: _MAX_CELL - 1])}…</span>', False
    return escape(text), False


def _legend(names: Sequence[str], colors: Sequence[str], axis: str | None = None) -> str:
    items = [
        f'<span style="--c:{c}">{escape(n)}</span>'
        for n, c in zip(names[:_MAX_LEGEND], colors, strict=False)
    ]
    if len(names) > _MAX_LEGEND:
        items.append(f"<span>and {len(names) - _MAX_LEGEND} more</span>")
    if axis:
        items.append(f'<em class="axis">x axis: {escape(axis)}, UTC</em>')
    return '<div class="legend">' + "".join(items) + "</div>"


def _colors(fixed: Mapping[str, str], names: Sequence[str]) -> list[str]:
    """Each series' colour: its fixed one (run statuses), grey for 'other', else the
    palette's in order."""
    return [
        fixed.get(n) or (OTHER_COLOR if n == "other" else color(i)) for i, n in enumerate(names)
    ]


def _body(result: PanelResult, meta: PageMeta) -> tuple[str, int]:
    """The panel's drawing and how many data rows it shows."""
    p = result.panel
    width = 1160 if p.width > 12 else 560
    if p.kind == "stat":
        value = stat_value(result)
        if value is None:
            return '<p class="nodata">No data in this time range</p>', 0
        return f'<div class="value mark">{escape(format_value(value, p.unit))}</div>', 1
    if not result.rows:
        return '<p class="nodata">No data in this time range</p>', 0
    if p.kind == "timeseries":
        series = series_of(result)
        if p.stacked or p.bars:
            series = fold_series(series)
        names = [s.name for s in series]
        colors = _colors(dict(p.colors), names)
        tr = result.time_range or TimeRange(meta.start, meta.end, meta.interval)
        svg = timeseries_svg(
            p.title,
            series,
            tr.start,
            tr.end,
            tr.interval,
            p.unit,
            stacked=p.stacked,
            bars=p.bars,
            width=width,
            colors=colors,
        )
        return svg + _legend(names, colors, p.time_axis), len(result.rows)
    if p.kind == "barchart":
        names, groups = categories(result)
        svg = bars_svg(p.title, names, groups, p.unit, width=width)
        legend = [g for g, _ in groups]
        return svg + _legend(legend, _colors({}, legend)), len(result.rows)
    units = dict(p.field_units)
    head = "".join(f"<th>{escape(c)}</th>" for c in result.columns)
    lines = []
    for row in result.rows[:_MAX_ROWS]:
        cells = [_cell(v, units.get(c, p.unit)) for c, v in zip(result.columns, row, strict=True)]
        lines.append(
            '<tr class="mark">'
            + "".join(f'<td class="num">{t}</td>' if n else f"<td>{t}</td>" for t, n in cells)
            + "</tr>"
        )
    more = len(result.rows) - _MAX_ROWS
    note = (
        f'<p class="desc">and {more} more rows (the SQL below lists them)</p>' if more > 0 else ""
    )
    table = f'<div class="scroll"><table><tr>{head}</tr>{"".join(lines)}</table></div>{note}'
    return table, len(result.rows)


def _panel(result: PanelResult, meta: PageMeta) -> str:
    p = result.panel
    title = p.title
    if result.error:
        body, rows = f'<p class="error">query failed: {escape(result.error)}</p>', 0
        extra = f' data-error="{escape(result.error)}"'
    else:
        body, rows = _body(result, meta)
        extra = ""
    sql = "\n\n".join(result.sql)
    return (
        f'<figure class="panel {escape(p.kind)}" style="grid-column: span {p.width}" '
        f'data-kind="{escape(p.kind)}" data-title="{escape(title)}" data-rows="{rows}"{extra}>'
        f"<figcaption>{escape(title)}</figcaption>"
        f'<p class="desc">{escape(p.description)}</p>{body}'
        f"<details><summary>SQL</summary><pre>{escape(sql)}</pre></details></figure>"
    )


def render_page(meta: PageMeta, results: Sequence[PanelResult]) -> str:
    """The whole HTML document for ``results`` (in layout order)."""
    parts, row = [], None
    for result in results:
        if result.panel.optional and not result.rows and not result.error:
            continue  # e.g. budgets: drawn only when the ledger has budget data
        if result.panel.row != row:
            row = result.panel.row
            parts.append(f"<h2>{escape(row)}</h2>")
        parts.append(_panel(result, meta))
    tenants = ", ".join(meta.tenants) if meta.tenants else "all"
    fmt = "%Y-%m-%d %H:%M:%S UTC"
    empty = [r.panel.title for r in results if not r.error and not r.rows and not r.panel.optional]
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>Prism report: {escape(meta.database)}</title><style>{_CSS}</style></head><body>"
        "<header><h1>Prism pipeline report</h1>"
        f"<p>Ledger <b>{escape(meta.ledger)}</b>, database <b>{escape(meta.database)}</b>; "
        f"tenants: {escape(tenants)}</p>"
        f"<p>From {meta.start.strftime(fmt)} to {meta.end.strftime(fmt)}, "
        f"interval {escape(_interval(meta.interval))}</p>{_clocks(meta)}"
        f"<p>Panels and SQL: {escape(meta.source)}</p></header>"
        f'<main class="grid">{"".join(parts)}</main>'
        f"<footer>Generated {meta.generated_at.strftime(fmt)} by prism-pipeline report; "
        f"{len(results)} panels, {len(empty)} without data.</footer></body></html>\n"
    )


def _clocks(meta: PageMeta) -> str:
    """Which range each clock's time series cover (event and receive time can lie far apart)."""
    fmt = "%Y-%m-%d %H:%M"
    parts = [
        f"{escape(clock)} {tr.start.strftime(fmt)} to {tr.end.strftime(fmt)} "
        f"(interval {escape(_interval(tr.interval))})"
        for clock, tr in sorted(meta.axes.items())
    ]
    return f"<p>Time series by {'; by '.join(parts)}</p>" if parts else ""


def _interval(step: timedelta) -> str:
    s = int(step.total_seconds())
    for size, unit in ((86400, "d"), (3600, "h"), (60, "m")):
        if s >= size and s % size == 0:
            return f"{s // size}{unit}"
    return f"{s}s"
