"""``prism-pipeline rebuild`` gives the ledger the live worker wrote; the worker's webhook alerts.

A simulated fleet (duplicates, reordering, post-terminal and conflicting terminals, junk)
goes to a 4-partition topic; the real worker (``prism-pipeline worker`` in a subprocess,
its own chDB path) consumes it, alerting a local webhook on every limit death. Once its
consumer group has committed every offset it is stopped, and ``rebuild`` replays the
topic into a second database of the same chDB path. The runs, usage, turns and raw
events must be equal, processing-time columns aside. chDB allows one engine path per
process, so that ledger is only ever read through ``prism-pipeline query`` subprocesses.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from prism.runtime.simulator import FleetConfig, publish_to_kafka, simulate
from tests.fixtures.kafka_io import create_topic

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

PARTITIONS = 4
FLEET = FleetConfig(
    runs=80,
    seed=23,
    duplicates=0.03,
    reorder_window=3,
    post_terminal=0.05,
    conflicting_terminals=0.03,
    malformed=0.02,
)
# view -> columns that depend on processing time or on how input was batched
EXCLUDED = {"runs": "version", "turns": "version", "usage": None, "run_events": "received_at"}
EXE = str(Path(sys.executable).with_name("prism-pipeline"))


class _Webhook(BaseHTTPRequestHandler):
    keys: Counter[str]

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.keys[self.headers["Idempotency-Key"]] += 1
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def webhook() -> Iterator[tuple[str, Counter[str]]]:
    keys: Counter[str] = Counter()
    handler = type("Handler", (_Webhook,), {"keys": keys})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/alerts", keys
    finally:
        server.shutdown()
        server.server_close()


async def _lag(bootstrap: str, group: str, topic: str) -> int:
    """Offsets of ``topic`` the group has not committed yet."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await admin.start()
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        if not tps:
            await consumer.topics()
            tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        ends = await consumer.end_offsets(tps)
        try:
            committed = await admin.list_consumer_group_offsets(group)
        except KafkaError:  # e.g. the group coordinator is still starting: nothing known yet
            committed = {}
        return sum(
            end - (committed[tp].offset if tp in committed else 0) for tp, end in ends.items()
        )
    finally:
        await consumer.stop()
        await admin.close()


def _wait_until_consumed(
    worker: subprocess.Popen[bytes],
    log: Path,
    bootstrap: str,
    group: str,
    topic: str,
    deadline_s: float = 180,
) -> None:
    deadline = time.monotonic() + deadline_s
    while (lag := asyncio.run(_lag(bootstrap, group, topic))) > 0:
        if worker.poll() is not None:
            pytest.fail(f"the worker exited with {worker.returncode}:\n{log.read_text()[-4000:]}")
        if time.monotonic() > deadline:
            pytest.fail(
                f"the worker still lags {lag} offsets on {topic}:\n{log.read_text()[-4000:]}"
            )
        time.sleep(1)


def _wait_until_quiet(keys: Counter[str], seconds: float = 3.0) -> None:
    """Until the webhook has seen nothing new for ``seconds`` (alerts trail the commit a bit)."""
    last, since = sum(keys.values()), time.monotonic()
    while time.monotonic() - since < seconds:
        time.sleep(0.5)
        if sum(keys.values()) != last:
            last, since = sum(keys.values()), time.monotonic()


def _query(env: dict[str, str], dsn: str, sql: str, database: str) -> list[dict[str, Any]]:
    """``query`` reads one ledger database at a time: each is named on its own."""
    done = subprocess.run(
        [EXE, "query", "--clickhouse", dsn, "--database", database, "--format", "json", sql],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _views_sql(db: str) -> str:
    parts = []
    for view, excluded in EXCLUDED.items():
        cols = f"* EXCEPT ({excluded})" if excluded else "*"
        parts.append(
            f"SELECT '{view}' AS v, '{db}' AS db, formatRow('JSONEachRow', {cols}) AS j "
            f"FROM {db}.{view}"
        )
    return " UNION ALL ".join(parts)


def _canonical(view: str, line: str) -> str:
    row = json.loads(line)
    if view == "runs" and row["timeline"]:  # the timeline repeats the row version
        timeline = json.loads(row["timeline"])
        timeline.pop("version", None)
        row["timeline"] = timeline
    return json.dumps(row, sort_keys=True)


def test_rebuild_equals_the_live_ledger(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, webhook: tuple[str, Counter[str]]
) -> None:
    url, delivered = webhook
    topic, group = f"{topic_prefix}.agent-events", f"g-{topic_prefix}"
    dsn = f"chdb://{tmp_path / 'ledger'}"
    asyncio.run(create_topic(kafka_bootstrap, topic, PARTITIONS))
    asyncio.run(publish_to_kafka(simulate(FLEET), kafka_bootstrap, topic, progress=False))
    env = {
        **os.environ,
        "PRISM_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "PRISM_TOPIC_PREFIX": topic_prefix,
        "PRISM_PARTITIONS": str(PARTITIONS),
        "PRISM_CONSUMER_GROUP": group,
        "PRISM_CLICKHOUSE_DSN": dsn,
        "PRISM_CLICKHOUSE_DATABASE": "live",
        "PRISM_RAW_EVENT_TTL_DAYS": "3650",
        "PRISM_STATE_DIR": str(tmp_path / "state"),
        "PRISM_STATE_STORE": "memory",
        "PRISM_GRACE_PERIOD_SECONDS": "1",
        "PRISM_ALERT_LIMIT_DEATHS_THRESHOLD": "1",
        "PRISM_ALERT_WEBHOOK_URL": url,
    }
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen([EXE, "worker"], env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            _wait_until_consumed(worker, log, kafka_bootstrap, group, topic)
            _wait_until_quiet(delivered)
        finally:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=60)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()

    rebuilt = subprocess.run(
        [EXE, "rebuild", "--database", "rebuilt", "--no-progress"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "rebuilt into:    rebuilt" in rebuilt.stdout

    rows: dict[tuple[str, str], list[str]] = defaultdict(list)
    for db in ("live", "rebuilt"):
        for r in _query(env, dsn, _views_sql(db), db):
            rows[(r["v"], r["db"])].append(_canonical(r["v"], r["j"]))
    for view in EXCLUDED:
        live, again = sorted(rows[(view, "live")]), sorted(rows[(view, "rebuilt")])
        assert live, f"the live ledger has no {view} rows"
        only_live, only_rebuilt = set(live) - set(again), set(again) - set(live)
        assert (only_live, only_rebuilt) == (set(), set()), f"{view} differs"
        assert live == again

    # The worker's alerts reached the webhook: each alert state exactly once.
    alerts = _query(env, dsn, "SELECT DISTINCT alert_id, state FROM live.alerts_store", "live")
    assert alerts, "the fleet's limit deaths raised no alert"
    assert delivered == Counter({f"{a['alert_id']}:{a['state']}": 1 for a in alerts})

    refused = subprocess.run(
        [EXE, "rebuild", "--database", "rebuilt", "--no-progress"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert refused.returncode == 1  # a refusal while running, not a usage error
    assert "already holds" in refused.stderr and "--force" in refused.stderr
