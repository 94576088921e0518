"""``prism-pipeline tail`` against the real broker (and the ledger for ``--from-ledger``).

Records are produced directly with aiokafka (key = runId) to a topic with several
partitions, out of order, with duplicates, post-terminal noise and other runs around.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from prism.pipeline._store import LedgerStore
from prism.pipeline.cli import main
from prism.pipeline.ingest import ingest_lines
from prism.pipeline.replay import follow, partition_for
from prism.pipeline.settings import load_settings
from prism.schemas import LedgerBatch
from prism.sinks import LedgerWriter, SourceRange, migrate
from prism.sinks.testing import event_row
from tests.fixtures.kafka_io import create_topic
from tests.fixtures.runs import RunBuilder

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

PARTITIONS = 4


def tool_call(b: RunBuilder, turn: int) -> RunBuilder:
    return b.add(
        "tool_call_finished",
        {"turn": turn, "tool": "search", "callIdHash": f"c{turn}", "durationMs": 12, "ok": True},
    )


def full_run(run_id: str, tenant: str = "acme") -> list[dict[str, Any]]:
    """seq 0..6, terminal agent_finished at seq 6."""
    b = RunBuilder(run_id, tenant=tenant).started().turn(1)
    tool_call(b, 1).turn(2).usage(turn=2, attempt=1, inputTokens=200, outputTokens=20)
    return b.turn(3, stop="end_turn").finished(finishReason="stop").events


def post_terminal(run_id: str, seq: int) -> dict[str, Any]:
    """A tool call above the terminal: it must never be printed as part of the run."""
    data = {"turn": 9, "tool": "late", "callIdHash": "c9", "durationMs": 1, "ok": True}
    return RunBuilder(run_id).add("tool_call_finished", data, seq=seq).events[0]


async def produce(bootstrap: str, topic: str, envelopes: list[dict[str, Any]]) -> list[Any]:
    """Produce in the given order (key = runId); return each record's metadata."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        futures = [
            await producer.send(topic, orjson.dumps(e), key=e["runId"].encode()) for e in envelopes
        ]
        return list(await asyncio.gather(*futures))
    finally:
        await producer.stop()


@pytest.fixture
def topic(kafka_bootstrap: str, topic_prefix: str) -> str:
    name = f"{topic_prefix}.agent-events"
    asyncio.run(create_topic(kafka_bootstrap, name, PARTITIONS))
    return name


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("prism-pipeline")
    env = {**os.environ, "PRISM_CLICKHOUSE_DSN": "chdb://:memory:"}
    return subprocess.run(
        [str(exe), *args], capture_output=True, text=True, timeout=90, env=env, check=False
    )


def seqs_and_ids(stdout: str) -> list[tuple[int, str]]:
    return [(e["seq"], e["eventId"]) for e in map(orjson.loads, stdout.splitlines())]


def test_tail_prints_each_event_once_in_seq_order_and_ends_on_the_terminal(
    kafka_bootstrap: str, topic_prefix: str, topic: str
) -> None:
    run = full_run("run-tail-1")
    noise = full_run("run-other-1") + full_run("run-other-2", tenant="globex")
    order = [3, 0, 2, 1, 2, 5, 0, 6, 4]  # out of order, seq 2 and 0 twice
    produced = [run[i] for i in order] + [post_terminal("run-tail-1", 7)]
    asyncio.run(produce(kafka_bootstrap, topic, noise[:5] + produced + noise[5:]))

    done = cli(
        "tail",
        "--run",
        "run-tail-1",
        "--bootstrap",
        kafka_bootstrap,
        "--topic-prefix",
        topic_prefix,
        "--timeout",
        "60",
    )

    assert done.returncode == 0, done.stderr
    assert seqs_and_ids(done.stdout) == [(e["seq"], e["eventId"]) for e in run]
    assert orjson.loads(done.stdout.splitlines()[-1])["type"] == "agent_finished"


def test_tail_with_a_missing_seq_times_out_listing_the_gap(
    kafka_bootstrap: str, topic_prefix: str, topic: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run = full_run("run-gap-1")
    asyncio.run(produce(kafka_bootstrap, topic, [run[i] for i in (1, 0, 4, 6, 3, 5)]))  # no seq 2

    code = main(
        [
            "tail",
            "--run",
            "run-gap-1",
            "--bootstrap",
            kafka_bootstrap,
            "--topic-prefix",
            topic_prefix,
            "--timeout",
            "3",
            "--no-ledger",
        ]
    )

    out, err = capsys.readouterr()
    assert code == 3
    assert [s for s, _ in seqs_and_ids(out)] == [0, 1, 3, 4, 5, 6]
    assert "missing seqs: 2;" in err and "terminal agent_finished at seq 6" in err


def test_tail_seeks_from_the_first_offset_the_ledger_recorded(
    kafka_bootstrap: str,
    topic_prefix: str,
    topic: str,
    ch_client: Any,
    ch_database: str,
    chdb_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = full_run("run-ledger-1")
    decoy = run[0] | {"eventId": "an-older-attempt"}  # earlier on the partition than the run
    metas = asyncio.run(produce(kafka_bootstrap, topic, [decoy, *run]))
    first = metas[1]
    assert first.partition == partition_for("run-ledger-1", PARTITIONS)
    migrate(ch_client, ch_database)
    writer = LedgerWriter(ch_client, ch_database)
    ts = datetime.fromisoformat(run[0]["ts"]).astimezone(UTC)
    row = event_row(
        "run-ledger-1-e0",
        "run-ledger-1",
        seq=0,
        ts=ts,
        source=topic,
        partition=first.partition,
        offset=first.offset,
    )
    writer.add(
        LedgerBatch(events=[row]), SourceRange(topic, first.partition, first.offset, first.offset)
    )
    writer.flush()

    code = main(
        [
            "tail",
            "--run",
            "run-ledger-1",
            "--bootstrap",
            kafka_bootstrap,
            "--topic-prefix",
            topic_prefix,
            "--timeout",
            "30",
            "--clickhouse",
            f"chdb://{chdb_path}",
            "--database",
            ch_database,
        ]
    )

    out, _ = capsys.readouterr()
    assert code == 0
    assert seqs_and_ids(out) == [(e["seq"], e["eventId"]) for e in run]


@pytest.mark.timeout(60)
async def test_follow_prints_new_events_of_the_chosen_tenants_and_types_once(
    kafka_bootstrap: str, topic_prefix: str, topic: str
) -> None:
    await produce(kafka_bootstrap, topic, full_run("run-before"))  # before: not live any more
    ready = asyncio.Event()
    seen: list[tuple[str, str]] = []
    settings = load_settings(kafka_bootstrap_servers=kafka_bootstrap, topic_prefix=topic_prefix)
    task = asyncio.create_task(
        follow(
            settings,
            lambda ev: seen.append((ev.run_id, ev.type)),
            tenants={"acme"},
            types={"agent_started", "agent_finished"},
            timeout=10,
            ready=ready.set,
        )
    )
    await asyncio.wait_for(ready.wait(), 30)
    a, b, c = full_run("run-a"), full_run("run-b"), full_run("run-c", tenant="globex")
    await produce(kafka_bootstrap, topic, [*a, a[0], a[-1], *c, *b])

    result = await task

    assert sorted(seen) == sorted(
        [
            ("run-a", "agent_started"),
            ("run-a", "agent_finished"),
            ("run-b", "agent_started"),
            ("run-b", "agent_finished"),
        ]
    )
    assert (result.printed, result.duplicates) == (4, 2)


def test_from_ledger_replays_a_run_in_seq_order(
    ch_client: Any, ch_database: str, chdb_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    migrate(ch_client, ch_database)
    run = full_run("run-archived")
    gappy = full_run("run-gappy")
    lines = [orjson.dumps(run[i]) for i in (2, 0, 1, 1, 6, 5, 3, 4)]
    lines += [orjson.dumps(post_terminal("run-archived", 7))]
    lines += [orjson.dumps(gappy[i]) for i in (0, 1, 3, 4, 5, 6)]
    ingest_lines(
        lines, source="file:archive.jsonl", store=LedgerStore(LedgerWriter(ch_client, ch_database))
    )
    base = [
        "tail",
        "--from-ledger",
        "--clickhouse",
        f"chdb://{chdb_path}",
        "--database",
        ch_database,
    ]

    assert main([*base, "--run", "run-archived"]) == 0
    out, _ = capsys.readouterr()
    assert seqs_and_ids(out) == [(e["seq"], e["eventId"]) for e in run]

    assert main([*base, "--run", "run-gappy", "--format", "pretty"]) == 3
    out, err = capsys.readouterr()
    assert [int(line.split()[0]) for line in out.splitlines()] == [0, 1, 3, 4, 5, 6]
    assert "missing seqs: 2;" in err

    assert main([*base, "--run", "no-such-run"]) == 1
    assert "no event of run 'no-such-run'" in capsys.readouterr().err
