"""``python -m bench``: argument parsing, the table, the targets and the JSON file (no timing)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import _harness as harness
from bench.bench_pipeline import stats_rate


def _row(bench: str, metric: str, value: float, unit: str) -> dict[str, object]:
    return {"bench": bench, "metric": metric, "value": value, "unit": unit}


def test_defaults_run_every_benchmark_in_order() -> None:
    args = harness.parse_args([])
    assert args.only == [
        "baseline", "worker", "machinery", "ingest", "freshness", "stages", "publisher", "parse",
        "ledger", "scaleout",
    ]  # fmt: skip
    assert (args.quick, args.events, args.rate, args.json) == (False, None, [5000.0, 10000.0], None)
    assert args.rows is False


def test_the_obsolete_state_store_option_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        harness.parse_args(["--state-store", "memory"])
    assert "unrecognized arguments: --state-store" in capsys.readouterr().err


def test_only_expands_pipeline_and_keeps_the_run_order() -> None:
    args = harness.parse_args(["--quick", "--only", "ledger", "pipeline", "--only", "parse"])
    assert args.quick
    assert args.only == [
        "baseline", "worker", "machinery", "ingest", "freshness", "parse", "ledger",
    ]  # fmt: skip


def test_options_are_parsed() -> None:
    args = harness.parse_args(["--events", "1000", "--rate", "2500", "--json", "out/r.json"])
    assert (args.events, args.rate, args.json) == (1000, [2500.0], Path("out/r.json"))
    assert harness.parse_args(["--rate", "1000", "8000", "--rate", "3000"]).rate == [
        1000.0, 8000.0, 3000.0,
    ]  # fmt: skip


@pytest.mark.parametrize(
    "argv",
    [["--only", "nope"], ["--events", "0"], ["--events", "ten"], ["--rate", "-5"], ["--only"]],
)
def test_bad_arguments_exit_with_usage(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        harness.parse_args(argv)
    assert exc.value.code == 2
    assert "usage: python -m bench" in capsys.readouterr().err


def test_table_aligns_columns_and_formats_values() -> None:
    table = harness.render_table(
        [
            _row("pipeline", "worker_events_per_s", 23456.789, "events/s"),
            _row("parse", "parse_batch_cost_vs_orjson", 4.531, "x"),
            _row("publisher", "publish_p50", 0.01234, "ms"),
        ]
    )
    lines = table.splitlines()
    assert lines[0].split() == ["bench", "metric", "value", "unit"]
    assert set(lines[1]) == {"-", " "}
    assert "23,457" in lines[2] and lines[2].endswith("events/s")
    assert "4.53" in lines[3]
    assert "0.01234" in lines[4]
    # the value column is right-aligned: every value ends at the same column
    values = ["23,457", "4.53", "0.01234"]
    ends = {line.index(v) + len(v) for line, v in zip(lines[2:], values, strict=True)}
    assert len(ends) == 1


def test_targets_report_met_not_met_and_not_measured() -> None:
    rows = [
        _row("pipeline", "worker_vs_baseline", 39.9, "%"),
        _row("pipeline", "ingest_vs_worker", 80.0, "%"),
        _row("ledger", "run_timeline_p95", 40.0, "ms"),
        _row("ledger", "billing_month_one_tenant_p95", 30.5, "ms"),
    ]
    status = {t["metric"]: t["status"] for t in harness.evaluate_targets(rows)}
    assert status["pipeline/worker_vs_baseline"] == "not met"
    assert status["pipeline/ingest_vs_worker"] == "met"  # the bound is inclusive
    assert status["ledger/run_timeline_p95"] == "met"
    assert status["ledger/billing_month_one_tenant_p95"] == "not met"
    assert status["pipeline/freshness_5000_p99"] == "not measured"


def test_the_targets_are_the_issues_and_each_names_one_figure() -> None:
    by_metric = {(t.bench, t.metric): (t.op, t.threshold) for t in harness.TARGETS}
    assert len(by_metric) == len(harness.TARGETS)  # one target per figure, beside it
    assert by_metric[("pipeline", "worker_vs_baseline")] == (">=", 40)
    assert by_metric[("pipeline", "freshness_5000_p99")] == ("<=", 1000)
    assert by_metric[("pipeline", "freshness_10000_p99")] == ("<=", 2000)
    assert by_metric[("pipeline", "freshness_10000_rss_over_baseline")] == ("<=", 150)
    assert by_metric[("ledger", "billing_month_all_tenants_p95")] == ("<=", 60)


def test_freshness_targets_are_read_at_their_own_offered_rate() -> None:
    rows = [
        _row("pipeline", "freshness_5000_p99", 800.0, "ms"),
        _row("pipeline", "freshness_10000_p99", 2500.0, "ms"),
        _row("pipeline", "freshness_8000_p99", 100.0, "ms"),  # a rate no target names
    ]
    fresh = {
        t["target"]: t["status"]
        for t in harness.evaluate_targets(rows)
        if t["metric"].endswith("_p99")
    }
    assert fresh == {
        "freshness p99 <= 1 s at 5,000 events/s": "met",
        "freshness p99 <= 2 s at 10,000 events/s": "not met",
    }
    only_8000 = [_row("pipeline", "freshness_8000_p99", 100.0, "ms")]
    statuses = {
        t["status"] for t in harness.evaluate_targets(only_8000) if t["metric"].endswith("_p99")
    }
    assert statuses == {"not measured"}


def test_derived_rows_compare_the_worker_with_the_bare_loop_and_ingest_with_the_worker() -> None:
    from bench._summary import derived_rows

    rows = [
        _row("pipeline", "baseline_peak_rss", 650.0, "MiB"),
        _row("pipeline", "worker_events_per_s", 10_000.0, "events/s"),
        _row("pipeline", "worker_peak_rss", 900.0, "MiB"),
        _row("pipeline", "freshness_5000_worker_peak_rss", 780.5, "MiB"),
        _row("pipeline", "freshness_10000_worker_peak_rss", 1200.0, "MiB"),
        _row("pipeline", "ingest_events_per_s", 7_500.0, "events/s"),
    ]
    got = {r["metric"]: r["value"] for r in derived_rows(rows)}
    assert got == {
        "worker_peak_rss_over_baseline": 250.0,
        "freshness_5000_rss_over_baseline": 130.5,
        "freshness_10000_rss_over_baseline": 550.0,
        "ingest_vs_worker": 75.0,
    }
    # without the bare loop's peak there is nothing to compare the worker's with
    alone = {r["metric"] for r in derived_rows(rows[1:])}
    assert alone == {"ingest_vs_worker"}
    assert derived_rows([]) == []


def test_the_summary_puts_each_target_beside_its_figure_in_a_fixed_order() -> None:
    from bench._summary import render_summary, summary_rows

    rows = [
        _row("ledger", "run_timeline_p95", 35.0, "ms"),
        _row("pipeline", "freshness_10000_p99", 2500.0, "ms"),
        _row("pipeline", "freshness_5000_p99", 700.0, "ms"),
        _row("pipeline", "worker_stage_store", 31.6, "us/event"),
        _row("pipeline", "worker_events_per_s", 12_000.0, "events/s"),
        _row("pipeline", "worker_insert_p50", 900.0, "ms"),  # only in the JSON
        _row("scaleout", "scaleout_2w_events_per_s", 15_000.0, "events/s"),
    ]
    lines = summary_rows(rows)
    by_row = {s["row"]: s for s in lines}
    assert "pipeline/worker_insert_p50" not in by_row
    order = [s["row"] for s in lines]
    assert (
        order.index("pipeline/worker_events_per_s")
        < order.index("pipeline/freshness_5000_p99")
        < order.index("pipeline/freshness_10000_p99")
        < order.index("ledger/run_timeline_p95")
    )
    assert by_row["pipeline/freshness_5000_p99"]["label"] == "freshness p99 at 5000/s offered"
    fresh = by_row["pipeline/freshness_5000_p99"]
    assert (fresh["target"], fresh["status"]) == ("<= 1,000 ms", "met")
    assert by_row["pipeline/freshness_10000_p99"]["status"] == "not met"
    worker = by_row["pipeline/worker_events_per_s"]
    assert (worker["target"], worker["status"]) == ("", "")  # a figure without a target
    # a target nothing measured keeps its line, so a reader sees what did not run
    missing = by_row["ledger/billing_month_one_tenant_p95"]
    assert (missing["value"], missing["status"]) == (None, "not measured")
    text = render_summary(lines)
    header, rule, *body = text.splitlines()
    assert header.split()[:3] == ["figure", "value", "unit"] and set(rule) == {"-", " "}
    assert len(body) == len(lines)
    timeline = next(line for line in body if "ledger/run_timeline_p95" in line)
    assert "35.00" in timeline and "<= 40 ms" in timeline and "met" in timeline
    assert "15,000" in next(line for line in body if "scaleout_2w" in line)


def test_the_worker_without_its_core_sits_beside_the_worker_and_the_bare_loop() -> None:
    from bench._summary import summary_rows

    rows = [
        _row("pipeline", "machinery_vs_baseline", 31.4, "%"),
        _row("pipeline", "machinery_events_per_s", 16_160.0, "events/s"),
        _row("pipeline", "worker_vs_baseline", 21.5, "%"),
        _row("pipeline", "freshness_5000_p99", 700.0, "ms"),
    ]
    lines = [s for s in summary_rows(rows) if s["row"].startswith("pipeline/")]
    order = [s["row"].removeprefix("pipeline/") for s in lines]
    assert order.index("worker_vs_baseline") + 1 == order.index("machinery_events_per_s")
    assert order.index("machinery_vs_baseline") < order.index("freshness_5000_p99")
    machinery = {s["row"]: s for s in lines}["pipeline/machinery_vs_baseline"]
    assert machinery["label"] == "worker without its core / bare loop"
    assert (machinery["target"], machinery["status"]) == ("", "")  # a figure, not a target


def test_main_prints_the_table_and_writes_the_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fake(name: str):  # type: ignore[no-untyped-def]
        if name == "ledger":

            def broken(quick: bool) -> list[dict[str, object]]:
                raise RuntimeError("the ledger child failed (1)")

            return broken
        return lambda quick: [_row(name, "parse_batch", 65_000.0 if not quick else 1.0, "events/s")]

    monkeypatch.setattr(harness, "_module_runner", fake)
    out = tmp_path / "results.json"
    code = harness.main(["--only", "parse", "ledger", "--json", str(out), "--rows"])
    printed = capsys.readouterr().out
    assert code == 1  # a failed benchmark fails the run; the others are still reported
    assert "parse_batch" in printed and "65,000" in printed  # --rows: every row too
    assert "error: ledger: RuntimeError: the ledger child failed (1)" in printed
    assert "billing one tenant p95" in printed and "not measured" in printed
    doc = json.loads(out.read_text())
    assert doc["rows"] == [_row("parse", "parse_batch", 65_000.0, "events/s")]
    assert doc["options"]["only"] == ["parse", "ledger"]
    assert doc["errors"] == ["ledger: RuntimeError: the ledger child failed (1)"]
    assert {t["status"] for t in doc["targets"]} == {"not measured"}
    # nothing the table shows was measured: it lists the targets of the benchmarks that ran
    # (the ledger's), each "not measured"; the JSON's targets keep them all
    ledger = {f"ledger/{t.metric}" for t in harness.TARGETS if t.bench == "ledger"}
    assert {s["row"] for s in doc["summary"]} == ledger and len(ledger) == 4
    assert {s["status"] for s in doc["summary"]} == {"not measured"}
    assert len(doc["targets"]) == len(harness.TARGETS)
    # the same figures printed and written: the printed table is the JSON's summary
    assert all(s["label"] in printed for s in doc["summary"])
    capsys.readouterr()
    harness.main(["--only", "parse", "--json", str(out)])
    assert "parse_batch" not in capsys.readouterr().out  # without --rows: the table only


def test_worker_rate_from_the_stats_file_counts_all_batches_but_one() -> None:
    stats = {"first_batch_at": 100.0, "last_batch_at": 102.0, "events": 30_000, "batches": 6}
    assert stats_rate(stats) == pytest.approx(12_500.0)  # 5 of 6 batches in 2 s
    assert stats_rate({**stats, "batches": 1}) is None
    assert stats_rate({**stats, "first_batch_at": None}) is None


def test_the_ledger_benchmark_builds_rows_the_ledger_schema_accepts() -> None:
    from datetime import UTC, datetime

    from bench.bench_ledger import TURNS_PER_RUN, _batches

    batches = list(_batches(3, datetime(2026, 11, 1, tzinfo=UTC), 3600.0, per_batch=2))
    assert [len(b.runs) for b in batches] == [2, 1]
    run = batches[0].runs[0]
    assert (run.status, run.model_turns, run.missing_count, run.closed) == (
        "succeeded", TURNS_PER_RUN, 0, True,
    )  # fmt: skip
    assert run.event_count == len([e for e in batches[0].events if e.run_id == run.run_id])


def test_the_stage_benchmark_batches_as_the_worker_does_by_default() -> None:
    from bench import bench_stages
    from prism.pipeline.settings import Settings

    assert Settings.model_fields["batch_max_events"].default == bench_stages.BATCH


def test_the_core_only_stage_bench_reports_the_best_run_split_into_parse_and_rest() -> None:
    from bench import bench_stages

    rows = {r["metric"]: r for r in bench_stages.core_only(1_500, batch_size=400, repeat=2)}
    assert list(rows) == [
        "core_events",
        "core_repeat",
        "core_compiled",
        "core_closed",
        "core_step",
        "core_parse",
        "core_rest",
    ]
    assert rows["core_events"]["value"] > 1_000 and rows["core_repeat"]["value"] == 2
    # the partitions stepped in turn move the watermark, so runs close (and rest and
    # shrink) as in the worker: stepped one partition whole after another, none closed
    assert rows["core_closed"]["value"] > 0 and rows["core_closed"]["unit"] == "runs"
    from prism.pipeline import core

    assert rows["core_compiled"]["value"] == int(core.COMPILED)  # which build was timed
    step, parse, rest = (rows[k]["value"] for k in ("core_step", "core_parse", "core_rest"))
    assert parse > 0 and rest > 0 and abs(step - parse - rest) < 0.01  # rounded to 3 places
    assert {rows[k]["unit"] for k in ("core_step", "core_parse", "core_rest")} == {"us/event"}


def test_the_worker_stage_rows_come_from_the_stats_file() -> None:
    from bench.bench_pipeline import stage_rows

    stats = {"stage_us": {"store": 21.5, "step_thread": 80.25}}
    assert [(r["metric"], r["value"], r["unit"]) for r in stage_rows(stats)] == [
        ("worker_stage_store", 21.5, "us/event"),
        ("worker_stage_step_thread", 80.25, "us/event"),
    ]
    assert stage_rows({"events": 3}) == []  # a stats file from before the stage figures


def test_the_ingest_rows_give_events_over_the_commands_wall_time_and_its_peak_rss() -> None:
    from bench.bench_ingest import ingest_rows

    rows = ingest_rows(200_000, 16.0, 700 * 1024, startup=1.5)
    assert [(r["bench"], r["metric"], r["value"], r["unit"]) for r in rows] == [
        ("pipeline", "ingest_events_per_s", 12_500.0, "events/s"),
        ("pipeline", "ingest_seconds", 16.0, "s"),
        ("pipeline", "ingest_startup", 1.5, "s"),
        ("pipeline", "ingest_peak_rss", 700.0, "MiB"),
    ]
    assert "ingest_startup" not in {r["metric"] for r in ingest_rows(10, 1.0, 1024)}
    with pytest.raises(ValueError, match="no ingest rate"):
        ingest_rows(0, 1.0, 1024)
    table = harness.render_table(rows)  # beside the worker's rows, in the one table
    assert "ingest_events_per_s" in table and "12,500" in table


def test_only_ingest_runs_the_ingest_part_without_a_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    from bench import bench_ingest, bench_pipeline

    assert harness.parse_args(["--only", "ingest"]).only == ["ingest"]

    class NoBroker:
        def __init__(self, **_: object) -> None:
            self.bootstrap = "127.0.0.1:1"

        def up(self) -> None:
            raise AssertionError("the ingest part needs no broker")

        def down(self) -> None:
            raise AssertionError("the ingest part needs no broker")

    seen: list[int] = []

    def fake_ingest(values, root, logs, log):  # type: ignore[no-untyped-def]
        seen.append(len(values))
        return bench_ingest.ingest_rows(len(values), 2.0, 2048)

    monkeypatch.setattr("prism.devstack.LocalKafka", NoBroker)
    monkeypatch.setattr(bench_ingest, "measure_ingest", fake_ingest)
    rows, errors = bench_pipeline.measure(events=300, parts=["ingest"], log=lambda _: None)
    assert errors == [] and seen == [rows[0]["value"]]
    assert [r["metric"] for r in rows] == [
        "fleet_events", "ingest_events_per_s", "ingest_seconds", "ingest_peak_rss",
    ]  # fmt: skip


def test_the_traced_heap_rows_name_the_files_holding_the_most_relative_to_the_repo() -> None:
    import tracemalloc

    from bench.bench_stages import _traced_rows

    tracemalloc.start()
    try:
        held = [bytearray(1024) for _ in range(4096)]  # 4 MiB allocated on this file's lines
        snapshot = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    rows = _traced_rows(snapshot, top=3)
    assert len(rows) <= 3 and rows[0]["metric"] == "traced_end[tests/unit/test_bench_harness.py]"
    assert rows[0]["value"] >= 4.0 and rows[0]["unit"] == "MiB"
    assert len(held) == 4096


@pytest.mark.parametrize(
    "module",
    ["bench_ingest", "bench_parse", "bench_pipeline", "bench_publisher", "bench_scaleout"],
)
def test_every_benchmark_module_answers_help_without_measuring(module: str) -> None:
    # these start brokers and workers when run: --help must stop at the parser
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", f"bench.{module}", "--help"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"python -m bench.{module} --quick" in done.stdout and "examples:" in done.stdout
    assert "[bench]" not in done.stderr  # no progress line: nothing started


@pytest.mark.parametrize("module", ["bench_stages", "bench_ledger"])
def test_the_benchmarks_run_alone_answer_help_with_examples_and_measure_nothing(
    module: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib

    bench = importlib.import_module(f"bench.{module}")
    monkeypatch.setattr(bench, "run", lambda *a, **k: pytest.fail("--help ran the benchmark"))
    with pytest.raises(SystemExit) as done:
        bench.main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert f"python -m bench.{module}" in out and "examples:" in out
    assert "--child" not in out  # the child processes' own options stay hidden


@pytest.mark.parametrize(
    ("argv", "named"),
    [(["--batch", "0"], "'0' must be 1 or more"), (["--events", "many"], "'many' is not a whole")],
)
def test_the_stage_benchmark_refuses_a_bad_size_by_its_value(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from bench import bench_stages

    with pytest.raises(SystemExit) as done:
        bench_stages.main(argv)
    assert done.value.code == 2 and named in capsys.readouterr().err


def test_a_ledger_benchmark_child_without_its_part_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from bench import bench_ledger

    with pytest.raises(SystemExit) as done:
        bench_ledger.main(["--child", "--month", "2026-11-01"])
    assert done.value.code == 2 and "--build or --measure" in capsys.readouterr().err
