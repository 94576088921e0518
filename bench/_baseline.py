"""Baseline of the pipeline benchmark: a bare aiokafka -> orjson -> clickhouse-connect loop.

No run semantics at all (no dedup, no state, no output topics, no offset commits; a fresh
consumer group only assigns the partitions): fetch large batches with ``getmany``,
``orjson.loads`` each value, and insert columns of ~5,000 rows into a raw-events table of
a chDB engine, waiting for each insert in a thread while the consumer keeps fetching (as
the worker does). Its rate is the Python limit on this
machine for moving events from a topic into ClickHouse.

chDB hosts one engine path per process, so this runs as a child process and prints one
JSON line: ``{"events", "stored", "seconds", "events_per_s", "inserts", "peak_rss_kib",
"end_rss_kib"}`` (end: the resident set after the last insert, the consumer stopped); the clock
runs from the first record consumed to the last insert acknowledged.

Run: ``.venv/bin/python -m bench._baseline --bootstrap 127.0.0.1:9092 --topic T --events N
--chdb /tmp/baseline``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import time
from datetime import datetime
from typing import Any

import orjson

DATABASE = "baseline"
COLUMNS = ("event_id", "run_id", "seq", "type", "ts", "tenant_id", "payload", "partition", "offset")
_DDL = f"""
CREATE TABLE IF NOT EXISTS {DATABASE}.raw_events (
    event_id String, run_id String, seq Int64, type LowCardinality(String),
    ts DateTime64(3, 'UTC'), tenant_id LowCardinality(Nullable(String)),
    payload String CODEC(ZSTD(3)), partition Int32, offset Int64
) ENGINE = MergeTree ORDER BY (run_id, seq, event_id)
"""


async def consume(
    bootstrap: str,
    topic: str,
    events: int,
    chdb_path: str,
    *,
    batch_rows: int = 5000,
    idle_timeout: float = 60.0,
) -> dict[str, Any]:
    """Move ``events`` records from ``topic`` into the raw-events table; return the figures."""
    from aiokafka import AIOKafkaConsumer

    from prism.sinks import connect

    client = connect(f"chdb://{chdb_path}", DATABASE)
    client.command(f"CREATE DATABASE IF NOT EXISTS {DATABASE}")
    client.command(_DDL)

    def insert(columns: list[list[Any]]) -> None:
        client.insert(
            "raw_events", columns, column_names=COLUMNS, database=DATABASE, column_oriented=True
        )

    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"bench-baseline-{os.getpid()}-{time.time_ns()}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        max_partition_fetch_bytes=8 * 1_048_576,
        fetch_max_bytes=64 * 1_048_576,
    )
    await consumer.start()
    try:
        done = inserts = 0
        first: float | None = None
        columns: list[list[Any]] = [[] for _ in COLUMNS]
        last_progress = time.monotonic()
        while done < events:
            fetched = await consumer.getmany(timeout_ms=1000, max_records=batch_rows)
            if not fetched:
                if time.monotonic() - last_progress > idle_timeout:
                    raise SystemExit(
                        f"no records for {idle_timeout:.0f}s after {done} of "
                        f"{events} from {topic!r}; was the fleet published?"
                    )
                continue
            if first is None:
                first = time.perf_counter()
            last_progress = time.monotonic()
            for tp, msgs in fetched.items():
                for m in msgs:
                    d = orjson.loads(m.value)
                    row = (
                        d["eventId"],
                        d["runId"],
                        d["seq"],
                        d["type"],
                        datetime.fromisoformat(d["ts"]),
                        d.get("tenantId"),
                        m.value,
                        tp.partition,
                        m.offset,
                    )
                    for col, value in zip(columns, row, strict=True):
                        col.append(value)
                    done += 1
            if len(columns[0]) >= batch_rows or done >= events:
                await asyncio.to_thread(insert, columns)
                inserts += 1
                columns = [[] for _ in COLUMNS]
        seconds = time.perf_counter() - (first or time.perf_counter())
    finally:
        await consumer.stop()
    stored = client.command(f"SELECT count() FROM {DATABASE}.raw_events")
    return {
        "events": done,
        "stored": int(str(stored)),
        "seconds": seconds,
        "events_per_s": done / seconds if seconds > 0 else 0.0,
        "inserts": inserts,
        "peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "end_rss_kib": _rss_kib(),
    }


def _rss_kib() -> int | None:
    """The resident set now (``VmRSS``) in KiB; None if unreadable."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench._baseline", description=__doc__)
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--events", type=int, required=True, help="stop after this many records")
    p.add_argument("--chdb", required=True, help="chDB engine path (fresh folder)")
    p.add_argument("--batch-rows", type=int, default=5000)
    args = p.parse_args(argv)
    result = asyncio.run(
        consume(args.bootstrap, args.topic, args.events, args.chdb, batch_rows=args.batch_rows)
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
