"""Inline SVG charts for the report: time series (lines, stacked areas, stacked bars) and bars.

No JavaScript and no external resource: each chart is one ``<svg>`` element with a
``viewBox``, so it scales with the page. Every drawn datum carries ``class="mark"`` (the
report test counts them) and a time series' marks name their series (``data-series``); all
text is escaped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from html import escape

from ._data import Series

__all__ = ["PALETTE", "bars_svg", "color", "format_value", "timeseries_svg"]

# Grafana's classic palette: distinct on white, in the order series are coloured.
PALETTE = (
    "#7eb26d", "#eab839", "#6ed0e0", "#ef843c", "#e24d42", "#1f78c1", "#ba43a9", "#705da0",
    "#508642", "#cca300", "#447ebc", "#c15c17", "#890f02", "#0a437c", "#6d1f62", "#584477",
)  # fmt: skip
_PAD_L, _PAD_R, _PAD_T, _PAD_B = 64, 16, 12, 28
_TIME_STEPS = [timedelta(seconds=s) for s in (1, 5, 10, 15, 30)] + [
    timedelta(minutes=m) for m in (1, 2, 5, 10, 15, 30, 60, 120, 180, 360, 720, 1440, 2880, 10080)
]


def color(i: int) -> str:
    """The colour of the ``i``-th series (the palette repeats after 16)."""
    return PALETTE[i % len(PALETTE)]


def _compact(v: float) -> str:
    a = abs(v)
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if a >= div:
            return f"{v / div:.3g}{suffix}"
    return f"{v:.3g}" if a < 1000 else f"{v:,.0f}"


def _duration(seconds: float) -> str:
    a = abs(seconds)
    if a < 1:
        return f"{seconds * 1000:.0f} ms"
    if a < 60:
        return f"{seconds:.3g} s"
    if a < 3600:
        return f"{seconds / 60:.3g} min"
    if a < 86400:
        return f"{seconds / 3600:.3g} h"
    return f"{seconds / 86400:.3g} d"


def format_value(value: float | None, unit: str, *, exact: bool = False) -> str:
    """A number in Grafana's unit (``s``, ``ms``, ``percentunit``, ``eps``, ``cpm``, ``short``)."""
    if value is None:
        return "-"
    if value == 0:
        return "0"
    if unit == "percentunit":
        return f"{value * 100:.1f}%"
    if unit == "s":
        return _duration(value)
    if unit == "ms":
        return _duration(value / 1000)
    if unit == "none" or (exact and unit == "short"):
        if float(value).is_integer():
            return f"{int(value):,}"
        return f"{value:,.2f}" if abs(value) >= 100 else f"{value:.4g}"
    text = _compact(value)
    return {"eps": f"{text}/s", "cpm": f"{text}/min"}.get(unit, text)


def _nice_step(span: float, ticks: int = 4) -> float:
    raw = span / ticks if span > 0 else 1.0
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if m * mag >= raw:
            return m * mag
    return 10 * mag


def _y_axis(low: float, high: float, unit: str, w: float, h: float) -> tuple[list[str], float]:
    """Grid lines and labels from ``low`` to a round top; returns (svg parts, top value)."""
    step = _nice_step(high - low)
    top = max(step, math.ceil(high / step) * step)
    parts = []
    v = low
    while v <= top + step / 2:
        y = _PAD_T + (h - _PAD_T - _PAD_B) * (1 - (v - low) / (top - low or 1))
        parts.append(
            f'<line x1="{_PAD_L}" x2="{w - _PAD_R}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
            f'<text x="{_PAD_L - 6}" y="{y + 4:.1f}" text-anchor="end">'
            f"{escape(format_value(v, unit))}</text>"
        )
        v += step
    return parts, top


def _x_axis(start: datetime, end: datetime, w: float, h: float) -> list[str]:
    span = (end - start).total_seconds() or 1.0
    step = next((s for s in _TIME_STEPS if span / s.total_seconds() <= 6), _TIME_STEPS[-1])
    sec = step.total_seconds()
    first = math.ceil(start.timestamp() / sec) * sec
    fmt = "%H:%M:%S" if sec < 60 else "%H:%M" if span <= 2 * 86400 else "%m-%d %H:%M"
    parts = []
    t = first
    while t <= end.timestamp():
        x = _PAD_L + (w - _PAD_L - _PAD_R) * (t - start.timestamp()) / span
        label = datetime.fromtimestamp(t, UTC).strftime(fmt)
        parts.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{_PAD_T}" y2="{h - _PAD_B}" class="grid"/>'
            f'<text x="{x:.1f}" y="{h - _PAD_B + 16}" text-anchor="middle">{label}</text>'
        )
        t += sec
    return parts


def _svg(w: float, h: float, title: str, body: Sequence[str]) -> str:
    return (
        f'<svg viewBox="0 0 {w:.0f} {h:.0f}" width="100%" role="img" '
        f'aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">'
        + "".join(body)
        + "</svg>"
    )


def timeseries_svg(
    title: str,
    series: Sequence[Series],
    start: datetime,
    end: datetime,
    interval: timedelta,
    unit: str,
    *,
    stacked: bool = False,
    bars: bool = False,
    width: float = 560,
    height: float = 220,
    colors: Sequence[str] = (),
) -> str:
    """Lines, or stacked areas (``stacked``), or stacked bars (``bars``), over ``[start, end]``.

    ``colors`` gives each series its colour (else the palette's, in order).
    """
    buckets = sorted({t for s in series for t, _ in s.points})
    values = [{t: v for t, v in s.points} for s in series]
    tops: dict[datetime, float] = dict.fromkeys(buckets, 0.0)
    if stacked or bars:
        for vals in values:
            for t in buckets:
                tops[t] += max(vals.get(t, 0.0), 0.0)
        high = max(tops.values(), default=0.0)
    else:
        high = max((v for vals in values for v in vals.values()), default=0.0)
    low = min(0.0, *(v for vals in values for v in vals.values())) if buckets else 0.0
    grid, top = _y_axis(low, high, unit, width, height)
    span = (end - start).total_seconds() or 1.0
    plot_w, plot_h = width - _PAD_L - _PAD_R, height - _PAD_T - _PAD_B

    def x(t: datetime) -> float:
        return _PAD_L + plot_w * (t - start).total_seconds() / span

    def y(v: float) -> float:
        return _PAD_T + plot_h * (1 - (v - low) / ((top - low) or 1))

    body = [*grid, *_x_axis(start, end, width, height)]
    base = dict.fromkeys(buckets, 0.0)
    bar_w = max(1.5, plot_w * interval.total_seconds() / span * 0.8)
    for i, vals in enumerate(values):
        c = colors[i] if i < len(colors) else color(i)
        mark = f'class="mark" data-series="{escape(series[i].name)}"'
        if bars:
            for t in buckets:
                v = max(vals.get(t, 0.0), 0.0)
                if v:
                    y0, y1 = y(base[t]), y(base[t] + v)
                    body.append(
                        f'<rect {mark} x="{x(t):.1f}" y="{y1:.1f}" width="{bar_w:.1f}" '
                        f'height="{max(y0 - y1, 0.5):.1f}" fill="{c}"/>'
                    )
                    base[t] += v
        elif stacked:
            upper = {t: base[t] + max(vals.get(t, 0.0), 0.0) for t in buckets}
            ring = [f"{x(t):.1f},{y(upper[t]):.1f}" for t in buckets]
            ring += [f"{x(t):.1f},{y(base[t]):.1f}" for t in reversed(buckets)]
            body.append(
                f'<polygon {mark} points="{" ".join(ring)}" fill="{c}" '
                f'fill-opacity="0.45" stroke="{c}" stroke-width="1"/>'
            )
            base = upper
        else:
            pts = sorted(vals.items())
            if len(pts) == 1:
                ((t, v),) = pts
                body.append(f'<circle {mark} cx="{x(t):.1f}" cy="{y(v):.1f}" r="3" fill="{c}"/>')
            elif pts:
                line = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in pts)
                body.append(
                    f'<polyline {mark} points="{line}" fill="none" stroke="{c}" stroke-width="2"/>'
                )
    return _svg(width, height, title, body)


def bars_svg(
    title: str,
    names: Sequence[str],
    groups: Sequence[tuple[str, Sequence[float | None]]],
    unit: str,
    *,
    width: float = 560,
) -> str:
    """Horizontal bars: one band per category, one bar per value column (group)."""
    bar_h, gap, label_w = 12, 10, 190
    band = bar_h * max(len(groups), 1) + gap
    height = _PAD_T + band * len(names) + _PAD_B
    high = max((v for _, vals in groups for v in vals if v is not None), default=0.0)
    step = _nice_step(high)
    top = max(step, math.ceil(high / step) * step) if high > 0 else 1.0
    plot_w = width - label_w - _PAD_R - 48
    body = []
    for k in range(5):
        tick = top * k / 4
        gx = label_w + plot_w * k / 4
        body.append(
            f'<line x1="{gx:.1f}" x2="{gx:.1f}" y1="{_PAD_T}" y2="{height - _PAD_B}" '
            f'class="grid"/><text x="{gx:.1f}" y="{height - _PAD_B + 16}" '
            f'text-anchor="middle">{escape(format_value(tick, unit))}</text>'
        )
    for row, name in enumerate(names):
        y0 = _PAD_T + row * band
        short = name if len(name) <= 30 else name[:29] + "…"
        body.append(
            f'<text x="{label_w - 8}" y="{y0 + band / 2 + 2:.1f}" text-anchor="end">'
            f"<title>{escape(name)}</title>{escape(short)}</text>"
        )
        for g, (_, vals) in enumerate(groups):
            v = vals[row]
            if v is None:
                continue
            bw = max(plot_w * max(v, 0.0) / top, 1.0)
            by = y0 + g * bar_h
            body.append(
                f'<rect class="mark" x="{label_w}" y="{by:.1f}" width="{bw:.1f}" '
                f'height="{bar_h - 2}" fill="{color(g)}"/>'
                f'<text x="{label_w + bw + 4:.1f}" y="{by + bar_h - 3:.1f}" class="value">'
                f"{escape(format_value(v, unit))}</text>"
            )
    return _svg(width, height, title, body)
