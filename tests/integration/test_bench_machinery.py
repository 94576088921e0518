"""``python -m bench --only machinery``: the worker without its core, on a broker of its own."""

from __future__ import annotations

import pytest

from bench import bench_pipeline

pytestmark = pytest.mark.integration


@pytest.mark.timeout(300)
def test_the_worker_without_its_core_drains_the_backlog_and_reports_its_rate() -> None:
    rows, errors = bench_pipeline.measure(events=3000, parts=("machinery",), log=lambda _: None)
    assert errors == []
    got = {r["metric"]: r["value"] for r in rows}
    # its rate comes from its stats file: every record of the fleet went through its step
    assert got["fleet_events"] > 2000  # about the size asked, in whole runs
    assert got["machinery_events_per_s"] > 0 and got["machinery_peak_rss"] > 0
    # where its time went, from the same stats file as the worker's stages
    assert got["machinery_stage_fetch"] > 0 and got["machinery_stage_step_thread"] > 0
    assert "machinery_vs_baseline" not in got  # no bare loop ran beside it
    assert not any(metric.startswith("worker_") for metric in got)
