"""make demo's choices: the broker port, the ledger it may replace, its fleet, its next steps."""

from __future__ import annotations

import json
import socket
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from prism.devstack import LocalKafka, free_port
from prism.devstack._demo_text import next_steps
from prism.devstack.demo import DemoError, choose_port, fleet_config, main, reset_ledger
from prism.pipeline.settings import load_settings


def test_the_port_is_the_one_asked_for_else_the_default_else_a_free_one(tmp_path: Path) -> None:
    assert choose_port(tmp_path, 19092) == (19092, "PRISM_KAFKA_PORT/--kafka-port")
    free = free_port()
    assert choose_port(tmp_path, None, default=free) == (free, "the default")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        port, why = choose_port(tmp_path, None, default=taken)
    assert port != taken
    assert why == f"a free port: {taken} is taken (set PRISM_KAFKA_PORT to choose)"


def test_a_busy_port_ends_the_demo_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        monkeypatch.setenv("PRISM_KAFKA_PORT", str(taken))
        assert main([]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"make demo: error: port {taken} on 127.0.0.1 is already in use")
    assert "PRISM_KAFKA_PORT=19092 make demo" in err and err.count("\n") == 1


def test_a_port_variable_that_is_not_a_number_is_named(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PRISM_KAFKA_PORT", "abc")
    assert main([]) == 1
    assert "PRISM_KAFKA_PORT='abc' is not a TCP port" in capsys.readouterr().err


def _chdb_ledger(root: Path) -> Path:
    metadata = root / ".data" / "ledger" / "metadata"
    metadata.mkdir(parents=True)
    (metadata / "prism.sql").write_text("ATTACH DATABASE prism")
    return metadata.parent


def test_the_demo_refuses_a_default_ledger_it_did_not_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    ledger = _chdb_ledger(tmp_path)
    settings = load_settings(clickhouse_dsn="chdb://./.data/ledger")
    with pytest.raises(DemoError, match="already holds database 'prism', which make demo did"):
        reset_ledger(settings, force=False)
    assert ledger.exists()
    reset_ledger(settings, force=True)  # --reset
    assert not ledger.exists()


def test_the_demo_replaces_the_ledger_it_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    ledger = _chdb_ledger(tmp_path)
    marker = {"dsn": "chdb://./.data/ledger", "database": "prism"}
    (tmp_path / ".data" / "demo-ledger.json").write_text(json.dumps(marker))
    reset_ledger(load_settings(clickhouse_dsn="chdb://./.data/ledger"), force=False)
    assert not ledger.exists()


def test_the_fleet_runs_on_the_wall_clock_with_the_burst_when_the_simulator_has_one() -> None:
    config = fleet_config(50, 7, 12)
    assert config.clock == "wall" and config.runs == 50 and config.duplicates > 0
    if hasattr(config, "limit_death_burst"):
        assert config.limit_death_burst == 12


def test_next_steps_name_the_ledger_commands_with_this_demos_dates(tmp_path: Path) -> None:
    client = SimpleNamespace(
        query=lambda sql: SimpleNamespace(
            result_rows=[(datetime(2026, 11, 30, 17, 5, tzinfo=UTC),) * 2]
        )
    )
    broker = LocalKafka(state_dir=tmp_path, port=19092)
    manifest: dict[str, Any] = {
        "runs": {
            "run-b": {"status": "succeeded"},
            "run-a": {"status": "failed", "exhaustion": {"limit": "maxTurns"}},
        }
    }
    text = next_steps(
        client, "prism", load_settings(topic_prefix="demo1"), tmp_path / "r.html", broker, manifest
    )
    assert (
        ".venv/bin/prism-pipeline billing --from 2026-11-30 --to 2026-12-01 --format table" in text
    )
    assert ".venv/bin/prism-pipeline query 'SELECT status, count() AS runs FROM runs" in text
    assert f".venv/bin/prism-pipeline report          # rewrites {tmp_path / 'r.html'}" in text
    assert (
        "PRISM_KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:19092 PRISM_TOPIC_PREFIX=demo1 "
        ".venv/bin/prism-pipeline tail --run run-a"
    ) in text
