"""``bench.bench_stages`` as ``python -m`` runs it: its child process, chDB and all."""

from __future__ import annotations

import pytest

from bench import bench_stages

pytestmark = pytest.mark.integration


def test_the_traced_heap_rows_see_what_the_run_state_and_the_last_batch_hold() -> None:
    rows = {r["metric"]: r["value"] for r in bench_stages.run(events=3000, batch=1000, trace=True)}
    assert rows["stages_events"] > 2000
    # freeing the intake must give its lanes' run state back: a reference left to it (the
    # parse timer held its bound method once) made this row 0 whatever the state held
    assert rows["traced_state"] > 0
    assert rows["traced_last_batch"] > 0
    assert rows["traced_peak"] >= rows["traced_end"] > 0
    assert any(metric.startswith("traced_end[") for metric in rows)


def test_the_inserts_stage_is_their_wall_time_not_the_sum_of_the_tables() -> None:
    rows = {r["metric"]: r["value"] for r in bench_stages.run(events=3000, batch=1000)}
    tables = sum(v for metric, v in rows.items() if metric.startswith("stage_insert."))
    # a flush's tables go in at once on the chDB engine: their times overlap
    assert 0 < rows["stage_insert_total"] < tables
    assert rows["stage_insert_total"] + rows["stage_columns"] < rows["stage_total"]
