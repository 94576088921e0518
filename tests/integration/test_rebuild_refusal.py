"""``rebuild``'s refusal counts runs, not storage rows; a failed rebuild leaves no database."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from prism.pipeline._store import LedgerStore
from prism.pipeline.cli import main
from prism.pipeline.ingest import ingest_lines
from prism.pipeline.replay import RebuildRefused, rebuild
from prism.pipeline.settings import load_settings
from prism.runtime.simulator import FleetConfig, simulate
from prism.sinks import LedgerWriter, migrate

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _databases(ch_client: Any, like: str) -> set[str]:
    rows = ch_client.query(
        "SELECT name FROM system.databases WHERE name LIKE {p:String}", parameters={"p": like}
    ).result_rows
    return {r[0] for r in rows}


async def test_the_refusal_counts_runs_not_storage_rows(ch_client: Any, ch_database: str) -> None:
    migrate(ch_client, ch_database, raw_event_ttl_days=3650)
    fleet = simulate(FleetConfig(runs=40, seed=3))
    ingest_lines(
        (r.value for r in fleet.records),
        source="file:f.jsonl",
        store=LedgerStore(LedgerWriter(ch_client, ch_database)),
    )
    # A second version of every run: the store now holds twice as many rows as runs.
    ch_client.command(
        f"INSERT INTO {ch_database}.runs_store SELECT * FROM {ch_database}.runs_store"
    )
    stored = ch_client.query(f"SELECT count() FROM {ch_database}.runs_store").result_rows[0][0]
    assert stored >= 2 * len(fleet.manifest["runs"])

    with pytest.raises(RebuildRefused) as refused:
        await rebuild(load_settings(), ch_client, ch_database)
    assert f"already holds {len(fleet.manifest['runs'])} runs" in str(refused.value)


def test_a_rebuild_that_fails_drops_the_database_it_created(
    ch_client: Any, chdb_path: Path, kafka_bootstrap: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _databases(ch_client, "prism_rebuild_%")
    prefix = f"t{uuid.uuid4().hex[:8]}.missing"
    code = main(
        [
            "rebuild",
            "--clickhouse",
            f"chdb://{chdb_path}",
            "--bootstrap",
            kafka_bootstrap,
            "--topic-prefix",
            prefix,
            "--no-progress",
        ]
    )
    assert code == 1
    assert f"topic '{prefix}.agent-events' does not exist" in capsys.readouterr().err
    assert _databases(ch_client, "prism_rebuild_%") == before

    named = f"t_rb_{uuid.uuid4().hex[:8]}"
    assert main(["rebuild", "--clickhouse", f"chdb://{chdb_path}", "--bootstrap",
                 kafka_bootstrap, "--topic-prefix", prefix, "--database", named]) == 1  # fmt: skip
    assert _databases(ch_client, named) == set()


def test_a_failed_rebuild_keeps_a_database_that_existed_before(
    ch_client: Any, ch_database: str, chdb_path: Path, kafka_bootstrap: str
) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}.missing"
    code = main(["rebuild", "--clickhouse", f"chdb://{chdb_path}", "--bootstrap",
                 kafka_bootstrap, "--topic-prefix", prefix, "--database", ch_database])  # fmt: skip
    assert code == 1
    assert _databases(ch_client, ch_database) == {ch_database}
