"""``make soak``: a chaos soak of the whole pipeline against the simulator's ground truth.

A 3-broker KRaft cluster, 3 worker processes in one consumer group over 12 partitions
(each with its own state dir and embedded chDB ledger), the simulator offering ``--rate``
events/s for ``--minutes``, while a seeded driver (``_chaos.py``) kills and restarts
workers, adds and removes a fourth, pauses one past the session timeout (a zombie),
kills and restarts a broker and kills whichever worker holds the limit-deaths partition;
a share of the fleet is published with other keys (event-id keys, null keys, partitions
other than the run's home). When the load ends and the group drained, the workers stop
and the verdict compares the workers' ledgers, folded into one as one server would hold
them, with the manifest (``_truth.compare``), and checks the bounds. Exit 0 only if all
of it holds.

Example::

    python -m prism.devstack.soak                 # make soak: 10 minutes, seed 1
    python -m prism.devstack.soak --minutes 0.75 --rate 1500 --seed 2 --json verdict.json
    python -m prism.devstack.soak --faults none --foreign-key-share 0   # a control run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import multiprocessing
import os
import pickle
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prism.pipeline.settings import Settings, load_settings
from prism.pipeline.topics import ensure_topics, worker_env

from ._chaos import ACTIONS, TP, Chaos, GroupWatch, Slot, WorkerPool
from ._cluster import LocalKafkaCluster
from ._truth import compare, render

__all__ = ["main"]

SESSION_TIMEOUT_S = 10.0
WORKERS = 3  # the long-lived ones; the chaos adds and removes a fourth
# Brokers with full tiered compilation (C2) for soaks this long or longer: they take 0.85
# cores at 5,000 events/s instead of 1.0 with C1 only, after a minute of warm-up at
# 1.3-1.5 cores, which a short soak spends entirely in (its partitions stalled 52 s)
C2_MINUTES = 5.0
STALL_BOUND_S = 45.0
BLIND_BOUND_S = 30.0  # the longest the group may go unobserved for the figures to count
DRAIN_RATE = 1000.0  # events/s: the slowest drain of the backlog left after the load
EVENTS_PER_RUN = 15.3  # what the demo's fleet averages, to size a fleet for a rate
# Bytes on disk per event offered: 9.1 GB after 898,220 records (3 min at 5,000/s), with
# the input, its repartition copies, the state changelogs and the outputs, three replicas.
DISK_PER_EVENT = 10_500
_CHUNK = 20_000
_EVENT_ID = re.compile(rb'"eventId":"([^"]+)"')
_NOT_REPORTED = "not reported by the worker"


def _log(line: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {line}", flush=True)


def long_lived(name: str) -> bool:
    """Whether worker ``name`` (``w1``, ``w2``, ...) is one of the ``WORKERS`` that run the
    whole soak (static members), not one the chaos adds and removes."""
    return int(name.lstrip("w")) <= WORKERS


# -- the fleet: simulated in a child process, so its memory is freed before the load --------
def _simulate(runs: int, seed: int, out: Path) -> None:
    from prism.runtime.simulator import simulate, write_manifest

    from .demo import fleet_config

    fleet = simulate(fleet_config(runs, seed, 12))  # the demo's fleet, a burst of 12 deaths
    write_manifest(fleet, out / "manifest.json")
    quarantined = fleet.manifest.get("quarantined_events", {})
    with open(out / "records.pickle", "wb") as f:
        for i in range(0, len(fleet.records), _CHUNK):
            chunk = [(r.family, r.key, r.value, r.headers) for r in fleet.records[i : i + _CHUNK]]
            pickle.dump(chunk, f, protocol=pickle.HIGHEST_PROTOCOL)
    with open(out / "applied.tsv", "w") as f:
        seen: set[str] = set()
        for ev in fleet.events:
            if ev["eventId"] not in seen and ev["eventId"] not in quarantined:
                f.write(f"{ev['eventId']}\t{ev['runId']}\n")
            seen.add(ev["eventId"])
    q = [{k: ev[k] for k in ("eventId", "runId", "seq")} for ev in fleet.events
         if ev["eventId"] in quarantined]  # fmt: skip
    (out / "quarantined.json").write_text(json.dumps(q))


def simulate_fleet(runs: int, seed: int, out: Path) -> None:
    child = multiprocessing.get_context("fork").Process(target=_simulate, args=(runs, seed, out))
    child.start()
    try:
        child.join(1800)
    finally:
        if child.is_alive():  # interrupted, or out of time
            child.kill()
            child.join()
    if child.exitcode != 0:
        raise RuntimeError(f"simulating {runs:,} runs failed (exit {child.exitcode})")


# -- the load -----------------------------------------------------------------------------
class Publisher:
    """Sends the records file at ``rate``/s from a thread; ``share`` of them with other keys."""

    def __init__(self, path: Path, settings: Settings, rate: float, share: float, seed: int):
        self.path, self.settings, self.rate, self.share = path, settings, rate, share
        self.rng = random.Random(f"{seed}:keys")
        self.sent = 0
        self.foreign: dict[str, int] = {"event_id_key": 0, "null_key": 0, "other_partition": 0}
        self.per_topic: dict[str, int] = {}
        self.started = self.ended = 0.0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="publisher", daemon=True)

    def _run(self) -> None:
        try:
            asyncio.run(self._send())
        except BaseException as exc:
            self.error = exc

    async def _send(self) -> None:
        from aiokafka import AIOKafkaProducer
        from aiokafka.partitioner import DefaultPartitioner

        t = self.settings.topics
        topics = {"agent": t.input, "channel": t.channel_operations}
        producer = AIOKafkaProducer(
            bootstrap_servers=self.settings.kafka_bootstrap_servers, enable_idempotence=True,
            acks="all", linger_ms=20, request_timeout_ms=60_000, max_request_size=4 << 20,
            compression_type="zstd",  # as a runtime's publisher should (SCALING.md)
        )  # fmt: skip
        await producer.start()
        partitioner = DefaultPartitioner()
        homes: dict[tuple[str, bytes], int] = {}

        def home(family: str, key: bytes, ps: list[int]) -> int:
            if (family, key) not in homes:
                homes[(family, key)] = partitioner(key, ps, ps)
            return homes[(family, key)]

        parts = {f: sorted(await producer.partitions_for(to)) for f, to in topics.items()}
        batches: dict[tuple[str, int], list[Any]] = {}
        futures: list[asyncio.Future[Any]] = []

        async def ship(where: tuple[str, int]) -> None:
            builder, _, _ = batches.pop(where)
            futures.append(await producer.send_batch(builder, where[0], partition=where[1]))
            if len(futures) >= 20_000:  # keep the undelivered ones; raise a failed delivery
                for fut in futures:
                    if fut.done():
                        fut.result()
                futures[:] = [fut for fut in futures if not fut.done()]

        self.started = time.monotonic()
        try:
            with open(self.path, "rb") as f:
                while not self._stop.is_set():
                    try:
                        chunk = pickle.load(f)
                    except EOFError:
                        break
                    for family, key, value, headers in chunk:
                        while self.sent >= (time.monotonic() - self.started) * self.rate:
                            now = time.monotonic()
                            for w in [w for w, b in batches.items() if now - b[2] >= 0.02]:
                                await ship(w)
                            await asyncio.sleep(0.005)
                        ps = parts[family]
                        at = home(family, key, ps)
                        key, p = self._keyed(key, value, ps, at, partitioner)
                        where = (topics[family], p)
                        for _ in range(2):
                            b = batches.get(where)
                            if b is None:
                                b = batches[where] = [producer.create_batch(), 0, time.monotonic()]
                            if b[0].append(key=key, value=value, timestamp=None,
                                           headers=list(headers)) is not None:  # fmt: skip
                                b[1] += 1
                                break
                            await ship(where)
                        self.per_topic[where[0]] = self.per_topic.get(where[0], 0) + 1
                        self.sent += 1
            for w in list(batches):
                await ship(w)
            await asyncio.gather(*futures)
        finally:
            self.ended = time.monotonic()
            await producer.stop()

    def _keyed(
        self, key: bytes, value: bytes, parts: list[int], at: int, hash_of: Callable[..., int]
    ) -> tuple[bytes | None, int]:
        """The key and partition a record goes out with: its own, or another producer's."""
        if self.share <= 0 or self.rng.random() >= self.share:
            return key, at
        how = self.rng.choice(sorted(self.foreign))
        found = _EVENT_ID.search(value)
        if how == "event_id_key" and found:  # a producer keyed by event id
            out: tuple[bytes | None, int] = found.group(1), hash_of(found.group(1), parts, parts)
        elif how == "other_partition" and len(parts) > 1:  # one that picks partitions itself
            out = key, self.rng.choice([p for p in parts if p != at])
        else:  # no key: a partition of the client's choosing
            how, out = "null_key", (None, self.rng.choice(parts))
        self.foreign[how] += 1
        return out

    def stop(self) -> None:
        self._stop.set()

    @property
    def rate_achieved(self) -> float:
        end = self.ended or time.monotonic()
        return self.sent / max(1e-6, end - self.started) if self.started else 0.0


# -- the verdict --------------------------------------------------------------------------
_EXPORT = """
import sys
from prism import sinks
dsn, out = sys.argv[1:3]
c = sinks.connect(dsn, "prism", create=False)
for t, _ in sinks.STORAGE_TABLES.values():
    c.command(f"INSERT INTO FUNCTION file('{out}/{t}.native', 'Native') SELECT * FROM prism.{t} "
              "SETTINGS engine_file_truncate_on_insert=1")
"""


def fold_ledgers(ledgers: list[Path], into: Path) -> Any:
    """One ledger holding every worker's storage rows, as one server would; its client.

    Each ledger's storage tables are exported by a process of its own (one chDB engine
    path per process) and inserted into a new ledger, whose views then fold the rows
    (ReplacingMergeTree: the highest version per key) for ``_truth.compare`` to read.
    """
    from prism import sinks

    exports = []
    for i, path in enumerate(ledgers):
        out = into.parent / f"export-{i}"
        out.mkdir(parents=True)
        done = subprocess.run([sys.executable, "-c", _EXPORT, f"chdb://{path}", str(out)],
                              capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"exporting the ledger {path} failed: {done.stderr[-2000:]}")
        exports.append(out)
    client = sinks.connect(f"chdb://{into}", "prism")
    sinks.migrate(client, "prism")
    for out in exports:
        for f in sorted(out.glob("*.native")):
            client.command(f"INSERT INTO prism.{f.stem} SELECT * FROM file('{f}', 'Native')")
    return client


_MISSING = "event_id NOT IN (SELECT event_id FROM prism.run_events)"
_DOUBLED = (
    "SELECT event_id, groupArray(run_id), groupArray(seq) FROM prism.run_events "
    "GROUP BY event_id HAVING count() > 1 LIMIT 10"
)


def event_accounting(client: Any, applied: Path) -> dict[str, Any]:
    """Events the fleet must have applied that the ledger lacks, holds twice or never had."""
    src = f"file('{applied}', 'TSV', 'event_id String, run_id String')"

    def rows(sql: str) -> list[Any]:
        return [list(r) for r in client.query(sql).result_rows]

    return {
        "lost": rows(f"SELECT count() FROM {src} WHERE {_MISSING}")[0][0],
        "doubled": rows("SELECT count() - uniqExact(event_id) FROM prism.run_events")[0][0],
        "unexpected": rows(
            "SELECT uniqExact(event_id) FROM prism.run_events "
            f"WHERE event_id NOT IN (SELECT event_id FROM {src})"
        )[0][0],
        "lost_runs": [
            r[0] for r in rows(f"SELECT DISTINCT run_id FROM {src} WHERE {_MISSING} LIMIT 10")
        ],
        "doubled_events": rows(_DOUBLED),
    }


def _stats(slot: Slot) -> dict[str, Any] | None:
    """A worker's ``worker-stats.json`` as it last wrote it (None: none, or half written)."""
    try:
        stats: dict[str, Any] = json.loads((slot.root / "state" / "worker-stats.json").read_text())
    except (OSError, ValueError):
        return None
    return stats


def worker_reports(pool: WorkerPool) -> dict[str, dict[str, Any]]:
    """Each worker's ``state_restore_s`` and ``fenced_writes``, or that it reports none."""
    out: dict[str, dict[str, Any]] = {}
    for s in pool.slots:
        stats = _stats(s) or {}
        out[s.name] = {
            "state_restore_s": stats.get("state_restore_s", _NOT_REPORTED),
            "fenced_writes": stats.get("fenced_writes", _NOT_REPORTED),
            "peak_rss_mb": round(s.peak_rss_kb / 1024, 1),
            "incarnations": s.incarnation,
        }
    return out


def _consecutive_free_ports(n: int) -> int:
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = int(s.getsockname()[1])
        try:
            for p in range(base, base + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
    raise RuntimeError(f"found no {n} consecutive free ports")


# -- the soak -----------------------------------------------------------------------------
class _Interrupted(Exception):
    """SIGTERM or SIGINT: stop everything and exit."""


def _interrupt(signum: int, frame: Any) -> None:
    """The first SIGTERM/SIGINT stops the soak; later ones would cut its clean-up short."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    raise _Interrupted(signal.Signals(signum).name)


def _positions(positions: dict[tuple[str, int], tuple[int, int]], topic: str) -> tuple[int, int]:
    """(lag, end offsets total) of ``topic`` in ``positions`` (the watch's)."""
    got = [v for tp, v in positions.items() if tp[0] == topic]
    return sum(max(0, e - c) for c, e in got), sum(e for _, e in got)


def _progress(t0: float, pub: Publisher, watch: GroupWatch, chaos: Chaos | None, topic: str) -> str:
    lag, _ = _positions(watch.positions, topic)
    actions = len(chaos.done) if chaos else 0
    return (
        f"{time.monotonic() - t0:5.0f}s: offered {pub.sent:,} ({pub.rate_achieved:,.0f}/s), "
        f"lag {lag:,}, members {watch.stable() or watch.state or '-'}, rebalances "
        f"{watch.rebalances} (kept {watch.kept}), chaos actions {actions}"
        + (
            f"; the group last seen {ago:.0f}s ago"
            if (ago := time.monotonic() - watch.last_ok) > 5
            else ""
        )
    )


def _own_ends(watch: GroupWatch, pos: dict[TP, tuple[int, int]]) -> dict[TP, int]:
    """The end offsets in ``pos`` of the topics the workers write themselves."""
    return {k: e for k, (_, e) in pos.items() if k[0] not in watch.plain}


def _drain(
    watch: GroupWatch,
    pool: WorkerPool,
    timeout: float,
    settle: float = 5.0,
    stall: float = STALL_BOUND_S,
) -> float:
    """Wait until the group committed every record; seconds taken.

    1. The published topics: every committed offset at its end, for ``settle`` seconds.
    2. Every other topic the group reads (the workers' own: forwarded records, limit
       deaths and lane reports, which keep coming): committed up to the end offsets they
       had then, past trailing transaction markers.

    A group that stops draining fails after ``stall`` seconds without progress (neither
    the published topics' lag nor the workers' topics left behind fell to a new low, as
    the group was seen in the last 3 s); one that keeps draining, however slowly the
    machine lets it, may take up to ``timeout``.
    """
    started = time.monotonic()
    since: float | None = None
    last = 0.0
    lowest = (math.inf, math.inf)  # the least lag and workers' partitions behind seen
    progressed = started
    while time.monotonic() - started < timeout:
        pool.revive()
        pos = dict(watch.positions)
        plain = {k: v for k, v in pos.items() if k[0] in watch.plain}
        left = len(set(watch.targets) - watch.reached) if watch.targets else None
        if left == 0:
            return time.monotonic() - started
        now = time.monotonic()
        fresh = watch.fresh(now - 3.0)  # judged on a look of the last 3 s
        lag = sum(max(0, e - c) for c, e in plain.values())
        if left is None and fresh and plain and all(c >= e for c, e in plain.values()):
            since = since or now
            if now - since >= settle:
                watch.reach(_own_ends(watch, pos))
        elif left is None:
            since = None
        if fresh:
            behind = math.inf if left is None else left
            settling = left is None and since is not None  # at the ends, for `settle` s
            if lag < lowest[0] or behind < lowest[1] or settling:
                lowest, progressed = (min(lag, lowest[0]), min(behind, lowest[1])), now
            elif now - progressed >= stall:
                raise TimeoutError(
                    f"the group stopped draining: no progress for {now - progressed:.0f}s "
                    f"(lag {lag:,}, {left or 0} partitions of the workers' topics behind)"
                )
        if now - last >= 10:
            last = now
            behind_text = f"{left} partitions of the workers' topics behind" if left else ""
            _log(f"draining after {now - started:.0f}s: lag {lag:,} {behind_text}")
        time.sleep(0.5)
    missing = sorted(set(watch.targets) - watch.reached)
    raise TimeoutError(f"the group did not drain within {timeout:.0f}s (behind: {missing[:8]})")


def _clocks(pool: WorkerPool, after: float) -> tuple[object, ...] | None:
    """The live workers' clocks as their stats files last said, if every one of them wrote
    after ``after`` (wall time) with nothing holding its watermark back and the alerter's
    holder decided up to its watermark; else None."""
    marks, alerter = [], None
    for s in pool.live():
        st = _stats(s)
        if st is None:
            return None
        if st.get("updated_at", 0) < after or st.get("watermark_us") != st.get("top_us"):
            return None
        marks.append(st["watermark_us"])
        if st.get("alerts_watermark_us") is not None:
            if st.get("alerts_decided_us") != st["alerts_watermark_us"]:
                return None
            alerter = (s.name, st["alerts_watermark_us"])
    if not marks or alerter is None or len(set(marks)) != 1:
        return None
    return (marks[0], alerter)


def _quiesce(watch: GroupWatch, pool: WorkerPool, timeout: float, settle: float = 5.0) -> float:
    """Wait until the group decided everything up to its final watermark; seconds taken.

    Committing every record is not enough: when the last busy lane goes idle the pipeline's
    watermark jumps to the newest event time, and each worker's next ticks mark runs stale,
    decide channel operations and send the deaths the alerter decides on. So: every live
    worker reports one watermark with nothing holding it back, the alerter's holder has
    decided up to its own, both unchanged for ``settle`` seconds; then the group's own
    topics are committed up to their ends of that moment (the last ticks' deaths read).
    """
    started, wall = time.monotonic(), time.time()
    seen: tuple[object, ...] | None = None
    since: float | None = None
    while time.monotonic() - started < timeout:
        pool.revive()
        now = _clocks(pool, wall)
        if now is not None and now == seen:
            since = since or time.monotonic()
            if time.monotonic() - since >= settle:
                break
        else:
            seen, since = now, None
        time.sleep(0.5)
    else:
        raise TimeoutError(f"the workers did not settle on one watermark within {timeout:.0f}s")
    watch.reach(_own_ends(watch, dict(watch.positions)))
    while watch.targets and set(watch.targets) - watch.reached:
        if time.monotonic() - started >= timeout:
            missing = sorted(set(watch.targets) - watch.reached)
            raise TimeoutError(f"the group did not read its last outputs (behind: {missing[:8]})")
        time.sleep(0.5)
    return time.monotonic() - started


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The soak; returns the verdict (``ok`` and every figure)."""
    root = args.state_dir.resolve()
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    need = int(args.rate * args.minutes * 60 * DISK_PER_EVENT)
    free = shutil.disk_usage(root).free
    if free < need:
        raise RuntimeError(
            f"{root} has {free / 2**30:.1f} GiB free; a soak of {args.minutes:g} min at "
            f"{args.rate:,.0f} events/s writes about {need / 2**30:.1f} GiB (three brokers, "
            "every topic replicated three times, and the workers' ledgers)"
        )
    runs = max(200, int(args.rate * args.minutes * 60 / EVENTS_PER_RUN))
    _log(f"simulating {runs:,} runs (seed {args.seed}) into {root}")
    simulate_fleet(runs, args.seed, root)
    manifest = json.loads((root / "manifest.json").read_text())
    _log(f"{manifest['counts']['records']:,} records; starting a 3-broker cluster")
    cluster = LocalKafkaCluster(  # C2 too when minutes of load repay its warm-up
        root / "kafka", brokers=3, port=_consecutive_free_ports(3),
        jvm_options=() if args.minutes >= C2_MINUTES else None,
    )  # fmt: skip
    pool: WorkerPool | None = None
    watch: GroupWatch | None = None
    chaos: Chaos | None = None
    pub: Publisher | None = None
    try:
        cluster.up()
        base = load_settings(
            kafka_bootstrap_servers=cluster.bootstrap, topic_prefix="soak",
            consumer_group="soak-pipeline", partitions=12, replication_factor=3,
            grace_period_seconds=2.0, state_dir=root / "w0" / "state",
        )  # fmt: skip
        asyncio.run(ensure_topics(base))
        t = base.topics
        limit_topic = f"{base.topic_prefix}.limit-deaths"
        cluster.wait_in_sync(timeout=120)

        pool = WorkerPool(root, _worker_env(base))
        plain = {t.input, t.channel_operations}  # the only topics written without transactions
        topics = {**dict.fromkeys(plain, 12), limit_topic: 1}
        watch = GroupWatch(cluster.bootstrap, base.consumer_group, topics, plain, pool)
        watch.start()
        started = time.monotonic()
        for n in range(1, WORKERS + 1):  # one at a time, so each member is matched to its worker
            _join(pool.add(), n, watch, pool)
        took = time.monotonic() - started
        _log(f"{WORKERS} workers stable after {took:.0f}s; load and chaos begin")
        pub = Publisher(root / "records.pickle", base, args.rate, args.foreign_key_share, args.seed)
        chaos = Chaos(args.seed, pool, watch, cluster, t.input, limit_topic, SESSION_TIMEOUT_S)
        chaos.actions, chaos.log = args.actions, _log
        t0 = time.monotonic()
        watch.arm()
        pub.thread.start()
        chaos.start()
        last = t0
        while pub.thread.is_alive() and time.monotonic() - t0 < args.minutes * 60 + 600:
            pool.revive()
            time.sleep(0.5)
            if time.monotonic() - last >= 10:
                last = time.monotonic()
                _log(_progress(t0, pub, watch, chaos, t.input))
        if pub.thread.is_alive() or pub.error is not None:
            raise RuntimeError(f"the publisher did not finish: {pub.error!r}")
        _log(f"load ended: {_progress(t0, pub, watch, chaos, t.input)}; undoing the last fault")
        if not chaos.stop():
            raise RuntimeError("the chaos driver did not undo its last fault within 240s")
        backlog = _positions(watch.positions, t.input)[0]
        drained = _drain(watch, pool, args.drain_timeout or max(300.0, backlog / DRAIN_RATE))
        settled_s = _quiesce(watch, pool, timeout=300.0)
        _log(f"the workers settled on one watermark {settled_s:.0f}s after the drain")
        # the published topics at their ends; the workers' own up to where they were then
        settled = {k: v for k, v in watch.positions.items() if k[0] in plain}
        settled.update({k: (v, v) for k, v in watch.targets.items()})
        watch.arm(False)
        codes = pool.stop_all()
        watch.stop()
        _log(f"drained {drained:.0f}s after the load; workers stopped: {codes}")
        ledgers = [s.root / "ledger" for s in pool.slots]
        client = fold_ledgers(ledgers, root / "folded" / "ledger")
        qevents = json.loads((root / "quarantined.json").read_text())
        checks = compare(client, "prism", manifest, qevents)
        print(render(checks))
        events = event_accounting(client, root / "applied.tsv")
        ends = {topic: _positions(settled, topic)[1] for topic in (t.input, t.channel_operations)}
        verdict: dict[str, Any] = {
            "seed": args.seed,
            "minutes": args.minutes,
            "target_rate": args.rate,
            "offered_rate": round(pub.rate_achieved, 1),
            "load_s": round(pub.ended - pub.started, 1),
            "published": pub.sent,
            "published_per_topic": pub.per_topic,
            "end_offsets": ends,
            "foreign_keys": pub.foreign,
            "checks": [
                {"name": c.name, "ok": c.ok, "compared": c.compared, "problems": c.problems[:20]}
                for c in checks
            ],
            **events,
            "offsets_accounted": ends == pub.per_topic and all(c >= e for c, e in settled.values()),
            "partitions_read": len(settled),
            "min_rebalances_kept": args.min_rebalances,
            **_group_figures(watch, t0),
            "actions": chaos.done,
            "worker_exits": pool.exits,
            "exit_codes": codes,
            "drain_s": round(drained, 1),
            "workers": worker_reports(pool),
        }
        verdict["failures"] = _failures(verdict)
        verdict["ok"] = not verdict["failures"]
        return verdict
    finally:
        if chaos is not None:
            chaos.abort(150)  # undoes nothing more: what it killed stays down
        if pub is not None:
            pub.stop()
        if pool is not None:
            pool.kill_all()
        if watch is not None:
            watch.stop()
        cluster.down()
        if chaos is not None and not chaos.abort(150):  # it was still starting something
            if pool is not None:
                pool.kill_all()
            cluster.down()
        if not args.keep_kafka:  # the folded ledger and the worker logs stay
            shutil.rmtree(root / "kafka", ignore_errors=True)


def _worker_env(base: Settings) -> Callable[[str, Path], dict[str, str]]:
    """A worker's environment: ``base`` with its own state dir and embedded ledger. The
    three long-lived workers are static members under their names, as a deployment's
    fixed replicas would be (a restart within the session timeout keeps their slots);
    the fourth that comes and goes is a dynamic member, as an autoscaled one would be."""

    def env_for(name: str, where: Path) -> dict[str, str]:
        dsn = f"chdb://{where / 'ledger'}"
        update: dict[str, Any] = {"state_dir": where / "state", "clickhouse_dsn": dsn}
        if long_lived(name):
            update["consumer_group_instance_id"] = f"{base.consumer_group}-{name}"
        s = base.model_copy(update=update)
        where.mkdir(parents=True, exist_ok=True)
        session = str(int(SESSION_TIMEOUT_S))
        return {**worker_env(s), "PRISM_CONSUMER_SESSION_TIMEOUT_SECONDS": session}

    return env_for


def _group_figures(watch: GroupWatch, t0: float) -> dict[str, Any]:
    """What the watch saw of the group: rebalances, the longest stall, recoveries."""
    seconds, where, since = watch.longest_stall
    done = [f.recovered_s for f in watch.faults if f.recovered_s is not None]
    held = watch.holders_between(where, since, since + seconds) if where else []
    return {
        "rebalances": watch.rebalances,
        "rebalances_kept": watch.kept,
        "longest_stall_s": round(seconds, 1),
        "longest_stall_partition": list(where) if where else None,
        "longest_stall_from_s": round(since - t0, 1) if where else None,  # into the load
        # who held it meanwhile, from when (s into the load): the faults it spanned
        "longest_stall_holders": [[round(t - t0, 1), who] for t, who in held],
        "stall_bound_s": STALL_BOUND_S,
        "watch_blind_s": round(watch.blind, 1),  # longest time without a look at the group
        "recoveries": [
            {
                "fault": f.kind,
                "at_s": round(f.at - t0, 1),
                "s": None if f.recovered_s is None else round(f.recovered_s, 1),
            }
            for f in watch.faults
        ],
        "recovery_p50_s": round(statistics.median(done), 1) if done else None,
        "recovery_max_s": round(max(done), 1) if done else None,
    }


def _holders_text(held: list[list[Any]]) -> str:
    """``[[s into the load, holder], ...]`` as text: "w3 (pid 7) from 0.0s, then ..."."""
    if not held:
        return "(not seen: no stable assignment was observed during the stall)"
    return ", then ".join(f"{who} from {at}s" for at, who in held)


def _fault_times(recoveries: list[dict[str, Any]]) -> str:
    """ " (at 9.1s, 28.0s into the load)": when each timed fault began."""
    times = [f"{r['at_s']}s" for r in recoveries]
    return f" (at {', '.join(times)} into the load)" if times else ""


def _failures(v: dict[str, Any]) -> list[str]:
    """Every way the verdict ``v`` fails; empty: it passed."""
    out = [c["name"] for c in v["checks"] if not c["ok"]]
    out += [f"{k} {v[k]}" for k in ("lost", "doubled", "unexpected") if v[k]]
    out += ["offsets not accounted for"] * (not v["offsets_accounted"])
    if v["rebalances_kept"] < v["min_rebalances_kept"]:
        out.append(f"rebalances kept {v['rebalances_kept']} < {v['min_rebalances_kept']}")
    if v["watch_blind_s"] > BLIND_BOUND_S:  # a stall or a rebalance may have gone unseen
        out.append(f"the group was out of sight for {v['watch_blind_s']}s")
    if v["longest_stall_s"] >= v["stall_bound_s"]:
        out.append(f"a partition stalled {v['longest_stall_s']}s")
    missed = [r["fault"] for r in v["recoveries"] if r["s"] is None]
    out += [f"never recovered after {', '.join(missed)}"] * bool(missed)
    out += [f"worker exits: {v['worker_exits']}"] * bool(v["worker_exits"])
    out += [f"a worker stopped with {v['exit_codes']}"] * any(v["exit_codes"].values())
    return out


def _join(slot: Slot, n: int, watch: GroupWatch, pool: WorkerPool, timeout: float = 180) -> None:
    """Wait until ``slot``'s worker is the ``n``-th member of a stable group, matched to it."""
    started = time.monotonic()
    deadline = started + timeout
    while time.monotonic() < deadline:
        if slot.pid is None:
            raise RuntimeError(f"worker {slot.name} exited at start:\n{_tails(pool)}")
        if watch.fresh(started) and watch.stable() == n and len(watch.owners) == n:
            return
        time.sleep(0.5)
    raise RuntimeError(
        f"{n} workers did not form a stable group in {timeout:.0f}s:\n{_tails(pool)}"
    )


def _tails(pool: WorkerPool) -> str:
    return "\n".join(f"--- {s.name}:\n{s.proc.tail_log(15)}" for s in pool.slots if s.proc)


def render_verdict(v: dict[str, Any]) -> str:
    """The verdict as a reader checks it: every figure, then PASSED or what failed."""
    w = v["workers"]
    lines = [
        f"offered {v['published']:,} records at {v['offered_rate']:,.0f}/s "
        f"(target {v['target_rate']:,.0f}/s for {v['minutes']} min: the load took "
        f"{v['load_s']:.0f}s), seed {v['seed']}; "
        f"with other keys: {v['foreign_keys']}",
        f"ledger vs manifest: {sum(c['ok'] for c in v['checks'])} of {len(v['checks'])} checks "
        f"agree; events lost {v['lost']}, doubled {v['doubled']}, unexpected {v['unexpected']}",
        f"every offset accounted for: {v['offsets_accounted']} (committed = end on "
        f"{v['partitions_read']} partitions; end offsets {v['end_offsets']}, "
        f"published {v['published_per_topic']})",
        f"rebalances {v['rebalances']}, in which a worker kept partitions "
        f"{v['rebalances_kept']} (at least {v['min_rebalances_kept']})",
        f"longest stall of a partition with lag {v['longest_stall_s']}s "
        f"({v['longest_stall_partition']}, from {v['longest_stall_from_s']}s into the load; "
        f"bound {v['stall_bound_s']:.0f}s); the group unobserved {v['watch_blind_s']}s at most",
        "  held meanwhile by " + _holders_text(v["longest_stall_holders"]),
        f"recovery after {len(v['recoveries'])} faults{_fault_times(v['recoveries'])}: "
        f"p50 {v['recovery_p50_s'] or '-'}s, max {v['recovery_max_s'] or '-'}s",
        "chaos: " + ("; ".join(v["actions"]) or "none"),
    ]
    for name, r in w.items():
        lines.append(
            f"{name}: peak RSS {r['peak_rss_mb']} MB, {r['incarnations']} start(s), state "
            f"restore {r['state_restore_s']}, fenced zombie writes {r['fenced_writes']}"
        )
    lines.append("PASSED" if v["ok"] else "FAILED: " + "; ".join(v["failures"]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m prism.devstack.soak", description=(__doc__ or "").splitlines()[0]
    )
    env_minutes = float(os.environ.get("SOAK_MINUTES") or 10)
    p.add_argument(
        "--minutes",
        type=float,
        default=env_minutes,
        help="how long the load is offered (default SOAK_MINUTES, else 10)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=int(os.environ.get("SOAK_SEED") or 1),
        help="seeds the fleet, the fault times and the keys (default SOAK_SEED, else 1)",
    )
    p.add_argument("--rate", type=float, default=5000.0, help="events offered per second")
    p.add_argument(
        "--foreign-key-share",
        type=float,
        default=0.05,
        help="share of records published with another key or partition",
    )
    p.add_argument(
        "--min-rebalances",
        type=int,
        default=None,
        help="rebalances in which a worker kept partitions (default 2 a minute)",
    )
    p.add_argument(
        "--faults",
        default=",".join(ACTIONS),
        metavar="A,B",
        help=f"the faults to inject, of {', '.join(ACTIONS)} (none: a control run)",
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=None,
        help="seconds the group may take to drain after the load (default: 300, or longer "
        f"when the backlog left needs it at {DRAIN_RATE:,.0f} events/s); a group that makes "
        f"no progress for {STALL_BOUND_S:.0f}s fails sooner",
    )
    p.add_argument("--state-dir", type=Path, default=Path(".data/soak"))
    p.add_argument(
        "--keep-kafka",
        action="store_true",
        help="keep the brokers' logs after the verdict (about 10 GB for 3 minutes at "
        "5,000 events/s; removed by default, the ledgers and worker logs are kept)",
    )
    p.add_argument("--json", type=Path, default=None, help="also write the verdict here")
    args = p.parse_args(argv)
    # The watch and the publisher ride out a dead broker; aiokafka would log each attempt.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    args.actions = tuple(a for a in args.faults.split(",") if a and a != "none")
    if set(args.actions) - set(ACTIONS):
        p.error(f"--faults: unknown {sorted(set(args.actions) - set(ACTIONS))}; use {ACTIONS}")
    if args.min_rebalances is None:
        args.min_rebalances = max(1, int(2 * args.minutes)) if args.actions else 0
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _interrupt)
    try:
        verdict = run(args)
    except (_Interrupted, KeyboardInterrupt) as exc:
        print(f"soak: interrupted ({exc}); every broker and worker stopped", file=sys.stderr)
        return 130
    except (RuntimeError, TimeoutError, OSError, ValueError) as exc:
        print(f"soak: FAILED: {exc}", file=sys.stderr)
        if args.json:
            args.json.write_text(json.dumps({"ok": False, "failures": [str(exc)]}))
        return 1
    print(render_verdict(verdict))
    if args.json:
        args.json.write_text(json.dumps(verdict, indent=1, default=str))
    return 0 if verdict["ok"] else 2


if __name__ == "__main__":
    sys.exit(main())
