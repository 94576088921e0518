"""Publisher benchmark: events/s through a real broker and ``publish()`` call latency.

Starts its own ``LocalKafka`` (free port, temp dir; stopped at the end), pre-creates one
4-partition topic per configuration, and publishes a fleet of interleaved runs (~100k
events, quick: 20k; ~600-byte envelopes of realistic types) through ``EventPublisher``
with the ``"wait"`` policy, so nothing is dropped and the agent loop feels backpressure.
Per ``linger_ms``/``max_batch_size`` setting it reports:

- ``events_per_s``: events over the time from the first ``publish()`` until ``flush()``
  returned (building the envelopes included, as in a runtime); ``cpu_per_event``: this
  process's CPU time per event; ``events_per_batch``: records per produce batch;
- ``publish_p50``/``publish_p99``: the ``publish()`` call alone (encode, contract check,
  trace headers, buffer append);
- ``burst_flush_p50/p99``: ``flush()`` after bursts of 50 events (delivery latency);
  ``trickle_events_per_batch``: batching when events arrive ~2 per millisecond.

The default (``config=default`` rows) came from this comparison: four full runs on 2
shared, busy cores (load average 5-10); ranges over the runs, the first run measured
events/s only:

| linger, batch | events/s | CPU/event | events/batch | burst flush p50 | trickle ev/batch |
| --- | --- | --- | --- | --- | --- |
| 0 ms, 16 KiB (aiokafka default) | 4.4k-5.7k | 78-82 us | 21 | 4.5-8 ms | 2.0 |
| 0 ms, 64 KiB | 4.1k-8.0k | 65-83 us | 92 | 2.6-7.6 ms | 1.4 |
| 5 ms, 64 KiB (chosen) | 4.6k-8.6k | 66-84 us | 92 | 9-12 ms | 2.7 |
| 5 ms, 256 KiB | 4.4k-9.3k | 65-85 us | 357 | 8-11 ms | 2.6 |
| 20 ms, 256 KiB | 4.5k-8.6k | 63-79 us | ~350 | 25-28 ms | 6.0 |

Throughput is bound by Python CPU per event (the contract check is its largest single
part), so the settings move events/s less than the machine's noise. What they do change
is the number of produce requests: at saturation 16 KiB batches hold 21 events, a quarter
of 64 KiB's 92, while 256 KiB showed no consistent gain in events/s or CPU. A 5 ms
linger groups a trickle better than none (2.7 against 1.4-2.0 events per batch) for
~5 ms of added delivery latency (the pipeline batches for 500 ms anyway); 20 ms groups
more but adds ~25 ms.

Run: ``.venv/bin/python -m bench.bench_publisher [--quick]``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from prism.devstack import LocalKafka, free_port
from prism.runtime import (
    DEFAULT_LINGER_MS,
    DEFAULT_MAX_BATCH_SIZE,
    EventPublisher,
    new_event_id,
    utc_now_rfc3339,
)

KiB = 1024
_BURSTS, _BURST = 60, 50
_TRICKLE = 1000
# (linger_ms, max_batch_size); the default must be among them
CONFIGS_FULL = [(0, 16 * KiB), (0, 64 * KiB), (5, 64 * KiB), (20, 256 * KiB)]
CONFIGS_QUICK = [(0, 16 * KiB), (DEFAULT_LINGER_MS, DEFAULT_MAX_BATCH_SIZE)]
TENANTS = ["acme", "globex", "initech", "umbrella"]
MODELS = [{"provider": "anthropic", "model": "claude-sonnet-4"},
          {"provider": "openai", "model": "gpt-5"},
          {"provider": "local", "model": "llama-3-70b"}]  # fmt: skip


def _steps(rng: random.Random) -> list[tuple[str, dict[str, Any]]]:
    steps: list[tuple[str, dict[str, Any]]] = [("agent_started", {"idempotencyKey": "k"})]
    turns = rng.randint(1, 6)
    for n in range(1, turns + 1):
        usage = {"inputTokens": 1800 * n, "outputTokens": rng.randint(20, 400),
                 "cacheReadTokens": 900 * (n - 1), "cost": "0.0041", "currency": "USD"}  # fmt: skip
        steps.append(("provider_turn_finished", {
            "turn": n, "attempt": 1, "latencyMs": rng.randint(200, 3000),
            "stopReason": "tool_calls" if n < turns else "end_turn",
            "budgets": {"runInputUsed": 1800 * n, "turns": n, "maxTurns": 8},
            "tools": {"count": 5, "idsHash": "5f1c0e"},
            "cache": {"cacheReadTokens": 900 * (n - 1), "cacheWriteTokens": 0}, "usage": usage,
        }))  # fmt: skip
        steps.append(("usage_recorded", {"scope": "provider_turn", "turn": n, "attempt": 1,
                                         "usage": usage}))  # fmt: skip
        for t in range(rng.randint(0, 3) if n < turns else 0):
            steps.append(("tool_call_finished", {"turn": n, "tool": f"tool{t}",
                                                 "callIdHash": f"{n}-{t}", "ok": True,
                                                 "durationMs": rng.randint(1, 900)}))  # fmt: skip
    if rng.random() < 0.1:
        steps += [("run_limit_exceeded", {"limit": "maxTurns", "maximum": 8, "observed": 9}),
                  ("error", {"error": {"code": "run_limit", "message": "turn limit",
                                       "failureClass": "permanent"}})]  # fmt: skip
    else:
        steps.append(("agent_finished", {"finishReason": "stop"}))
    return steps


def fleet(n_events: int, seed: int = 7, concurrent: int = 200) -> Iterator[dict[str, Any]]:
    """``n_events`` wire envelopes of ``concurrent`` interleaved runs (new runs replace ended)."""
    rng = random.Random(seed)
    live: list[tuple[dict[str, Any], list[tuple[str, dict[str, Any]]]]] = []
    run_no = 0
    for _ in range(n_events):
        while len(live) < concurrent:
            run_no += 1
            base: dict[str, Any] = {
                "schema": "prism.agent-event/v1", "runId": f"run-{seed}-{run_no:07d}",
                "tenantId": rng.choice(TENANTS), "model": rng.choice(MODELS),
                "agent": {"id": "support-bot"}, "sessionId": f"s-{run_no}",
                "bundleDigest": "sha256:" + f"{run_no % 256:02x}" * 32, "seq": 0,
            }  # fmt: skip
            live.append((base, _steps(rng)[::-1]))
        i = rng.randrange(len(live))
        base, steps = live[i]
        type_, data = steps.pop()
        yield {**base, "eventId": new_event_id(), "type": type_, "ts": utc_now_rfc3339(),
               "data": data}  # fmt: skip
        base["seq"] += 1
        if not steps:
            live[i] = live[-1]
            live.pop()


async def _create_topics(bootstrap: str, names: list[str]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic(n, num_partitions=4, replication_factor=1) for n in names]
        )
    finally:
        await admin.close()


class _BatchCounter:
    """Counts the producer's record batches (aiokafka internals; bench-only instrumentation)."""

    def __init__(self, pub: EventPublisher) -> None:
        self.count = 0
        accumulator = pub._sink._producer._message_accumulator  # type: ignore[attr-defined]
        original = accumulator._append_batch

        def counting(builder: Any, tp: Any) -> Any:
            self.count += 1
            return original(builder, tp)

        accumulator._append_batch = counting


async def _measure(
    bootstrap: str, topic: str, n: int, linger: int, batch: int
) -> list[tuple[str, float, str]]:
    pub = EventPublisher(bootstrap, topic=topic, linger_ms=linger, max_batch_size=batch,
                         full_policy="wait", deadline=60.0, buffer_size=10_000)  # fmt: skip
    for env in fleet(500, seed=1):  # warm-up: connection, metadata
        await pub.publish(env)
    await pub.flush(timeout=60)
    batches = _BatchCounter(pub)
    latencies: list[int] = []
    clock = time.perf_counter_ns
    start, cpu_start = time.perf_counter(), time.process_time()
    for env in fleet(n, seed=2):
        t0 = clock()
        result = pub.publish(env)
        latencies.append(clock() - t0)
        if result.accepted is None:  # buffer full: the agent waits for room
            await result
    ok = await pub.flush(timeout=120)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    full_batches, batches.count = batches.count, 0
    flushes = []  # delivery latency at a trickle: bursts of 50 events, each flushed
    events = fleet(_BURSTS * _BURST, seed=3)
    for _ in range(_BURSTS):
        for env in itertools.islice(events, _BURST):
            pub.publish(env)
        t0 = clock()
        ok = await pub.flush(timeout=60) and ok
        flushes.append(clock() - t0)
    burst_batches, batches.count = batches.count, 0
    for i, env in enumerate(fleet(_TRICKLE, seed=4)):  # a trickle: ~2 events per millisecond
        pub.publish(env)
        if i % 2:
            await asyncio.sleep(0.001)
    ok = await pub.flush(timeout=60) and ok
    trickle_batches = batches.count
    await pub.close(timeout=30)
    stats = pub.stats
    expected = n + 500 + _BURSTS * _BURST + _TRICKLE
    if not ok or stats.delivered != expected or stats.dropped_full or stats.delivery_failed:
        raise RuntimeError(f"benchmark run lost events: {stats}")
    latencies.sort()
    flushes.sort()
    return [
        ("events_per_s", n / elapsed, "events/s"),
        ("cpu_per_event", cpu / n * 1e6, "us"),
        ("events_per_batch", n / max(full_batches, 1), "events"),
        ("publish_p50", latencies[len(latencies) // 2] / 1e3, "us"),
        ("publish_p99", latencies[int(len(latencies) * 0.99)] / 1e3, "us"),
        ("burst_flush_p50", flushes[len(flushes) // 2] / 1e6, "ms"),
        ("burst_flush_p99", flushes[int(len(flushes) * 0.99)] / 1e6, "ms"),
        ("burst_events_per_batch", _BURSTS * _BURST / max(burst_batches, 1), "events"),
        ("trickle_events_per_batch", _TRICKLE / max(trickle_batches, 1), "events"),
    ]


async def _run_all(bootstrap: str, n: int, configs: list[tuple[int, int]]) -> list[dict[str, Any]]:
    topics = [f"bench.publisher.{i}" for i in range(len(configs))]
    await _create_topics(bootstrap, topics)
    rows: list[dict[str, Any]] = []
    for topic, (linger, batch) in zip(topics, configs, strict=True):
        figures = await _measure(bootstrap, topic, n, linger, batch)
        default = (linger, batch) == (DEFAULT_LINGER_MS, DEFAULT_MAX_BATCH_SIZE)
        names = [f"linger={linger}ms,batch={batch // KiB}KiB"] + (["default"] if default else [])
        for name in names:
            for metric, value, unit in figures:
                rows.append({"bench": "publisher", "metric": f"{metric}[{name}]",
                             "value": round(value, 2), "unit": unit})  # fmt: skip
    return rows


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Start a broker, measure every configuration, stop the broker; one row per figure."""
    logging.getLogger("aiokafka").setLevel(logging.ERROR)  # metadata retries on new topics
    n = 20_000 if quick else 100_000
    configs = CONFIGS_QUICK if quick else CONFIGS_FULL
    with tempfile.TemporaryDirectory(prefix="bench-publisher-") as tmp:
        broker = LocalKafka(state_dir=Path(tmp) / "kafka", port=free_port())
        broker.up()
        try:
            return asyncio.run(_run_all(broker.bootstrap, n, configs))
        finally:
            broker.down()


if __name__ == "__main__":
    from bench._cli import parser, print_rows

    print_rows(
        run(quick=parser("bench_publisher", __doc__, ["", "--quick"]).parse_args().quick), 52
    )
