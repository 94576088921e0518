"""The HTML report, opened in headless Chromium, draws every panel with data and fetches nothing.

The ledger is filled by the fleet simulator through the same core as the worker (with
duplicates, reordering, junk, post-terminal noise, limit deaths and stale runs); the page
is built from the ``prism-report`` dashboard's panels and loaded from disk. The browser's
own measurements (each panel's box and drawn marks) and the pixels of its full-page
screenshot are checked; the screenshot stays next to the page for a human to look at.
"""

from __future__ import annotations

import itertools
import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from prism.dashboards import RUN_STATUSES, STATUS_COLORS, TOP_SERIES, report_panels
from prism.pipeline._store import LedgerStore
from prism.pipeline.cli import main
from prism.pipeline.ingest import ingest_lines
from prism.pipeline.report import build_report
from prism.runtime.simulator import FleetConfig, simulate
from prism.sinks import LedgerWriter, migrate
from tests.fixtures import budgets
from tests.fixtures.browser import decode_png, ensure_chromium, render_page

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

EARLY, LATE = timedelta(hours=1), timedelta(hours=3, minutes=15)
FLEET = FleetConfig(
    runs=400,
    seed=11,
    duplicates=0.02,
    reorder_window=3,
    post_terminal=0.05,
    conflicting_terminals=0.03,
    malformed=0.03,
    oversized=0.01,
    limit_death_burst=8,
)


@pytest.fixture(scope="session")
def chromium() -> str:
    try:
        return ensure_chromium()
    except RuntimeError as exc:  # fail, never skip: the report is what users look at
        pytest.fail(f"the report test needs headless Chromium: {exc}", pytrace=False)


@pytest.fixture(scope="module")
def ledger(ch_client: Any) -> Iterator[str]:
    database = f"t_report_{uuid.uuid4().hex[:10]}"
    ch_client.command(f"CREATE DATABASE {database}")
    try:
        migrate(ch_client, database, raw_event_ttl_days=3650)
        fleet = simulate(FLEET)
        start = FLEET.resolved_start
        # Batches arrive in two waves an hour apart, so receive times spread like a worker's.
        calls = itertools.count()
        ingest_lines(
            (r.value for r in fleet.records),
            source="file:fleet.jsonl",
            store=LedgerStore(LedgerWriter(ch_client, database)),
            clock=lambda: (start + (EARLY if next(calls) < 3 else LATE)).timestamp(),
            batch_size=500,
            max_event_bytes=FLEET.max_event_bytes,
        )
        budgets.store_crossing(ch_client, database, "acme", start)  # the budgets panel's row
        yield database
    finally:
        ch_client.command(f"DROP DATABASE IF EXISTS {database} SYNC")


def _colored(pixel: tuple[int, int, int]) -> bool:
    """A chart colour, not the page's greys (grid, text, background)."""
    return max(pixel) - min(pixel) > 60


def _dark(pixel: tuple[int, int, int]) -> bool:
    return max(pixel) < 140


def test_every_panel_draws_data_in_chromium_and_the_page_fetches_nothing(
    ch_client: Any, ledger: str, chromium: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    report = build_report(
        ch_client, ledger, ledger="chdb://test-ledger", now=datetime(2026, 12, 1, tzinfo=UTC)
    )
    assert [r.panel.title for r in report.failed] == []
    assert [r.panel.title for r in report.empty] == []
    assert "<script" not in report.html and " src=" not in report.html
    assert "url(" not in report.html and "@import" not in report.html

    out = tmp_path_factory.mktemp("report")
    page = report.write(out / "report.html")
    rendered = render_page(chromium, page)
    shot = out / "report.png"
    shot.write_bytes(rendered.png)
    print(f"report screenshot: {shot}")

    assert rendered.requests == [page.as_uri()], "the page requested something besides itself"
    titles = [r.panel.title for r in report.results]
    assert [f["title"] for f in rendered.figures] == titles
    for fig in rendered.figures:
        assert fig["error"] is None and fig["rows"] > 0, fig
        assert fig["marks"] > 0, f"{fig['title']}: no data mark has a size on screen"
        assert fig["w"] > 100 and fig["h"] > 20, fig

    _check_layout(report.html, {f["title"]: f for f in rendered.figures})

    image = decode_png(rendered.png)
    assert (image.width, image.height) == (1280, rendered.height)
    background = image.rows[2][2]
    sample = [px for row in image.rows[::7] for px in row[::7]]
    busy = sum(px != background for px in sample) / len(sample)
    assert busy > 0.3, f"the screenshot is mostly blank ({busy:.0%} non-background)"
    assert len(set(sample)) > 200, "the screenshot has almost no distinct colours"
    for fig in rendered.figures:
        box = [
            image.rows[y][x]
            for y in range(int(fig["y"]), min(int(fig["y"] + fig["h"]), image.height))
            for x in range(int(fig["x"]), min(int(fig["x"] + fig["w"]), image.width))
        ]
        if fig["kind"] == "table":
            assert sum(map(_dark, box)) > 500, f"{fig['title']}: the table shows no text"
        else:
            assert sum(map(_colored, box)) > 20, f"{fig['title']}: nothing drawn in colour"


def _rgb(hex_colour: str) -> str:
    r, g, b = (int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


def _check_layout(html: str, figures: dict[str, dict[str, Any]]) -> None:
    """What the browser shows: money per currency, status colours, clocks, short legends."""
    # one cost chart and one top-runs table per currency, each holding only its currency
    for name in ("Reported cost by tenant and model", "Top expensive runs"):
        assert {f"{name} (EUR)", f"{name} (USD)"} <= set(figures), sorted(figures)
    for currency in ("EUR", "USD"):
        table = re.search(
            rf'data-title="Top expensive runs \({currency}\)".*?</figure>', html, re.S
        )
        assert table, currency
        cells = set(re.findall(r"<td>(EUR|USD)</td>", table.group(0)))
        assert cells == {currency}, (currency, cells)
        chart = figures[f"Reported cost by tenant and model ({currency})"]
        assert figures["Top expensive runs (EUR)"]["w"] > 1000  # full width: no cut column
        assert chart["marks"] > 0
    # each run status in its own Okabe-Ito colour, in the one legend order
    runs = figures["Runs by status"]
    assert [n for n, _ in runs["legend"]] == list(RUN_STATUSES)
    assert all(c.upper() == STATUS_COLORS[n] for n, c in runs["legend"]), runs["legend"]
    drawn = {n: c for n, c in runs["fills"].items()}
    assert drawn and all(drawn[n] == _rgb(STATUS_COLORS[n]) for n in drawn), drawn
    assert {"succeeded", "failed"} <= set(drawn)
    for fig in figures.values():
        if fig["kind"] != "timeseries":
            continue
        # each time series names its clock and spreads over its axis, not against an edge
        assert fig["axis"] in ("x axis: event time, UTC", "x axis: receive time, UTC"), fig
        left, right = fig["span"]
        assert left < 0.5 < right, f"{fig['title']}: marks crowd one side ({left:.2f}-{right:.2f})"
        assert len(fig["legend"]) <= TOP_SERIES + 1, (fig["title"], fig["legend"])
    for title in ("Dead letters per minute by reason", "Quarantine per minute by reason",
                  "Ingest lag (received_at - ts)"):  # fmt: skip
        assert figures[title]["axis"] == "x axis: receive time, UTC", title


def test_the_report_command_writes_the_page_and_names_what_it_drew(
    ledger: str, chdb_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r" / "report.html"
    out.parent.mkdir()  # the command refuses an --out whose directory is missing
    code = main(
        ["report", "--clickhouse", f"chdb://{chdb_path}", "--database", ledger, "--out", str(out)]
    )
    text, err = capsys.readouterr()
    assert code == 0, err
    total = sum(2 if p.repeat else 1 for p in report_panels())  # a copy per EUR and USD
    assert f"wrote {out.resolve()} ({total} of {total} panels with data)" in text
    assert f"open it: file://{out.resolve()}" in text
    assert "Prism pipeline report" in out.read_text()

    # One tenant and a range with no data: the tenant-scoped panels say so, nothing fails.
    code = main(
        ["report", "--clickhouse", f"chdb://{chdb_path}", "--database", ledger, "--out",
         str(out), "--from", "2020-01-01", "--to", "2020-01-02", "--tenant", "acme-corp"]
    )  # fmt: skip
    text = capsys.readouterr().out
    assert code == 0
    for title in ("Runs by status", "Limit deaths by axis", "Alerts", "Top expensive runs"):
        assert f"  no data: {title}" in text


def test_an_empty_or_missing_ledger_is_one_line_with_what_to_do(
    ch_client: Any, ch_database: str, chdb_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["report", "--clickhouse", f"chdb://{chdb_path}", "--out", "/dev/null"]
    assert main([*base, "--database", ch_database]) == 1
    assert "holds no ledger; run `make demo`" in capsys.readouterr().err
    migrate(ch_client, ch_database)
    assert main([*base, "--database", ch_database]) == 1
    assert f"the ledger '{ch_database}' is empty" in capsys.readouterr().err
