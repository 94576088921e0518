"""Build the report: pick the time range, run the panels, render the page."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from ._data import PanelResult, ReportError, clock_spans, pick_interval, run_panels
from ._html import PageMeta, render_page

__all__ = ["DEFAULT_OUT", "Report", "ReportError", "build_report"]

DEFAULT_OUT = Path(".data/report.html")
_SOURCE = "Grafana dashboard prism-report (dashboards/json/prism-report.json)"


@dataclass(frozen=True, slots=True)
class Report:
    """The rendered page and what went into it."""

    html: str
    results: list[PanelResult]
    start: datetime
    end: datetime
    interval: timedelta

    @property
    def failed(self) -> list[PanelResult]:
        """Panels whose query failed (the page shows the error in their place)."""
        return [r for r in self.results if r.error]

    @property
    def empty(self) -> list[PanelResult]:
        """Panels whose queries returned no row in the time range."""
        return [r for r in self.results if not r.error and not r.rows]

    def write(self, path: Path) -> Path:
        """Write the page (creating its folder); return the absolute path."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.html, encoding="utf-8")
        return path.resolve()


def _padded(
    low: datetime,
    high: datetime,
    start: datetime | None,
    end: datetime | None,
    least: timedelta = timedelta(minutes=1),
) -> tuple[datetime, datetime]:
    """``[start, end]``, each side defaulting to the data's extent padded by a fiftieth
    (at least ``least``)."""
    pad = max((high - low) / 50, least)
    return start or low - pad, end or high + pad


def _floor(t: datetime, step: timedelta) -> datetime:
    seconds = step.total_seconds()
    return datetime.fromtimestamp(t.timestamp() // seconds * seconds, UTC)


def build_report(
    client: Any,
    database: str,
    *,
    ledger: str,
    start: datetime | None = None,
    end: datetime | None = None,
    tenants: Sequence[str] = (),
    now: datetime | None = None,
) -> Report:
    """Run every report panel on ``database`` and render the page.

    ``start``/``end`` default to the span of the ledger's data (a little padded);
    ``tenants`` narrows the tenant-scoped panels; ``ledger`` is the DSN shown on the page
    (pass it redacted). Each time series is drawn over the part of the range its own clock
    (event time or receive time) has data in, so neither clock's points crowd an edge.
    """
    from prism.dashboards import TimeRange

    if end is not None and start is not None and end <= start:
        raise ReportError(f"--to ({end.isoformat()}) must be after --from ({start.isoformat()})")
    spans = clock_spans(client, database)
    low = min(lo for lo, _ in spans.values())
    high = max(hi for _, hi in spans.values())
    start, end = _padded(low, high, start, end)
    if end <= start:
        raise ReportError(f"--to ({end.isoformat()}) must be after --from ({start.isoformat()})")
    interval = pick_interval(start, end)
    start = _floor(start, interval)
    axes = {}
    for clock, (lo, hi) in spans.items():
        if lo <= end and hi >= start:  # the clock has data in the range: its own axis
            # a clock's data can span a few minutes (a replay): pad it by its own size
            a, b = _padded(max(lo, start), min(hi, end), None, None, timedelta(seconds=1))
            a, b = max(a, start), min(b, end)
            step = pick_interval(a, b)
            axes[clock] = TimeRange(_floor(a, step), b, step)
    results = run_panels(client, database, TimeRange(start, end, interval), tenants, axes)
    meta = PageMeta(
        ledger=ledger,
        database=database,
        start=start,
        end=end,
        interval=interval,
        tenants=tuple(tenants),
        axes=axes,
        generated_at=now or datetime.now(UTC),
        source=_SOURCE,
    )
    return Report(render_page(meta, results), results, start, end, interval)
