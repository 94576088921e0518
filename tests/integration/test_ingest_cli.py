"""``prism-pipeline ingest-file`` as a backfill runs it: several files, several processes.

The run state lives in the ledger (``ingest_state``), so a hostile fleet split over two
files and two invocations gives the ledger that one file gives; standard input read twice
is two sources, so neither reading overwrites the other's dead letters.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from prism.runtime.simulator import FleetConfig, simulate
from tests.fixtures.ledger_compare import ledger_contents
from tests.fixtures.oracle import diff_manifest, snapshot, subprocess_query

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def _ingest(
    dsn: str, path: str, stdin: bytes | None = None, *args: str, env: dict[str, str] | None = None
) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "prism.pipeline.cli", "ingest-file", path, "--clickhouse", dsn,
         "--no-progress", *args],
        input=stdin, capture_output=True,
        env={**os.environ, "PRISM_CLICKHOUSE_DATABASE": "prism", **(env or {})},
        timeout=300, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.decode()


def test_a_hostile_backfill_split_over_two_invocations_equals_one_file(tmp_path: Path) -> None:
    fleet = simulate(FleetConfig(runs=150, seed=7, hostile=0.2, duplicates=0.03,
                                 reorder_window=3, post_terminal=0.05, malformed=0.02))  # fmt: skip
    values = [r.value for r in fleet.records]
    half = len(values) // 2
    whole, first, second = tmp_path / "all.jsonl", tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    whole.write_bytes(b"\n".join(values) + b"\n")
    first.write_bytes(b"\n".join(values[:half]) + b"\n")
    second.write_bytes(b"\n".join(values[half:]) + b"\n")
    one, two = f"chdb://{tmp_path}/one", f"chdb://{tmp_path}/two"
    _ingest(one, str(whole))
    _ingest(two, str(first))
    _ingest(two, str(second))
    a, b = subprocess_query(one), subprocess_query(two)
    contents_a, contents_b = ledger_contents(a, "prism"), ledger_contents(b, "prism")
    # dead letters are keyed by file and line: the split files number their lines anew
    contents_a.pop("dead_letters"), contents_b.pop("dead_letters")
    assert contents_b == contents_a
    assert diff_manifest(snapshot(b, "prism"), fleet.manifest) == []


def test_two_readings_of_standard_input_keep_their_own_dead_letters(tmp_path: Path) -> None:
    dsn = f"chdb://{tmp_path}/ledger"
    _ingest(dsn, "-", stdin=b"not json\n")
    _ingest(dsn, "-", stdin=b"not json either\n")
    rows = subprocess_query(dsn)("SELECT source, offset, reason FROM prism.dead_letters")
    assert len(rows) == 2 and len({r["source"] for r in rows}) == 2
    assert all(r["source"].startswith("stdin:") and r["offset"] == 1 for r in rows)


def test_parsing_ahead_or_not_the_ledger_and_the_summary_are_the_same(tmp_path: Path) -> None:
    """PRISM_PARSE_AHEAD reaches ingest-file; the next batch parsed while this one is
    inserted changes no row and no count (several batches: --batch-size 300)."""
    fleet = simulate(FleetConfig(runs=150, seed=11, hostile=0.2, duplicates=0.05,
                                 reorder_window=4, post_terminal=0.05, malformed=0.02,
                                 channel_operations=10))  # fmt: skip
    path = tmp_path / "fleet.jsonl"
    path.write_bytes(b"\n".join(r.value for r in fleet.records) + b"\n")
    on, off = f"chdb://{tmp_path}/on", f"chdb://{tmp_path}/off"
    said_on = _ingest(on, str(path), None, "--batch-size", "300")
    said_off = _ingest(off, str(path), None, "--batch-size", "300",
                       env={"PRISM_PARSE_AHEAD": "false"})  # fmt: skip
    assert said_on == said_off and "lines read:      " in said_on
    a, b = subprocess_query(on), subprocess_query(off)
    assert ledger_contents(a, "prism") == ledger_contents(b, "prism")
