"""Build the report: pick the time range, run the panels, render the page."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from ._data import PanelResult, ReportError, ledger_span, pick_interval, run_panels
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
    (pass it redacted).
    """
    from prism.dashboards import TimeRange

    if start is None or end is None:
        low, high = ledger_span(client, database)
        pad = max((high - low) / 50, timedelta(minutes=1))
        start = start or low - pad
        end = end or high + pad
    if end <= start:
        raise ReportError(f"--to ({end.isoformat()}) must be after --from ({start.isoformat()})")
    interval = pick_interval(start, end)
    start = datetime.fromtimestamp(
        start.timestamp() // interval.total_seconds() * interval.total_seconds(), UTC
    )
    results = run_panels(client, database, TimeRange(start, end, interval), tenants)
    meta = PageMeta(
        ledger=ledger,
        database=database,
        start=start,
        end=end,
        interval=interval,
        tenants=tuple(tenants),
        generated_at=now or datetime.now(UTC),
        source=_SOURCE,
    )
    return Report(render_page(meta, results), results, start, end, interval)
