"""The soak's worker pool, its observer of the consumer group and its seeded chaos driver.

``GroupWatch`` polls the group once a second with an admin client (member assignments,
committed and end offsets) and each worker's ``/proc`` peak RSS, and keeps what the
verdict needs: rebalances (and those in which a member kept partitions), the longest time
a partition with lag made no progress, and the recovery after each fault. ``Chaos`` runs
the faults at seeded random times, one at a time, each bounded in time; ``WorkerPool``
starts, restarts and stops the workers, each with its own state dir and chDB ledger.

A group member is matched to its worker by the worker's pid in its client id when it has
one, else by the member id the worker's log names (aiokafka logs "Joined group ... with
member_id X"), else by elimination: the one member no worker owns, when the group is
stable and exactly one running worker, started before the member appeared, owns none (the
soak starts workers one at a time and changes the group one fault at a time).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prism.pipeline.retry import retry_transient

from ._cluster import LocalKafkaCluster
from .workerproc import WorkerProcess

__all__ = ["ACTIONS", "Chaos", "GroupWatch", "Slot", "WorkerPool"]

ACTIONS = ("kill_worker", "add_remove_worker", "zombie", "kill_broker", "kill_limit_holder")
RECOVERY_LIMIT_S = 180.0  # a fault not recovered from by then counts as never recovered
TP = tuple[str, int]
_MEMBER_ID = re.compile(rb"member_id (\S+)")


@dataclass
class Slot:
    """One worker name: its state dir and ledger survive restarts (incarnations)."""

    name: str
    root: Path
    proc: WorkerProcess | None = None
    incarnation: int = 0
    peak_rss_kb: int = 0
    started_at: float = 0.0
    log_at: int = 0  # where this incarnation's lines begin in the log
    member_ids: set[str] = field(default_factory=set)  # named in this incarnation's log
    expected_down: bool = False  # the chaos driver stopped or killed it on purpose
    retired: bool = False  # an extra worker that was removed

    @property
    def pid(self) -> int | None:
        p = self.proc.proc if self.proc is not None else None
        return p.pid if p is not None and p.poll() is None else None


class WorkerPool:
    """The soak's workers; ``env_for(name, root)`` gives a worker's PRISM_* environment."""

    def __init__(self, root: Path, env_for: Callable[[str, Path], dict[str, str]]) -> None:
        self.root, self.env_for = root, env_for
        self.slots: list[Slot] = []
        self.lock = threading.RLock()
        self.exits: list[str] = []  # workers that exited without the driver asking

    def add(self) -> Slot:
        with self.lock:
            slot = Slot(f"w{len(self.slots) + 1}", self.root / f"w{len(self.slots) + 1}")
            self.slots.append(slot)
        return self.start(slot)

    def start(self, slot: Slot) -> Slot:
        with self.lock:
            slot.incarnation += 1
            env = self.env_for(slot.name, slot.root)
            log = self.root / f"{slot.name}.log"
            slot.log_at, slot.member_ids = log.stat().st_size if log.exists() else 0, set()
            slot.proc = WorkerProcess(env, log_path=log).start()
            slot.started_at = time.monotonic()
            slot.expected_down = False
        return slot

    def live(self, base: int = 3) -> list[Slot]:
        """Running workers among the first ``base`` (the ones that restart)."""
        return [s for s in self.slots[:base] if s.pid is not None]

    def read_member_ids(self, slot: Slot) -> set[str]:
        """Member ids the consumer client logged (aiokafka: "... with member_id X")."""
        with self.lock:
            return self._read_member_ids(slot)

    def _read_member_ids(self, slot: Slot) -> set[str]:
        try:
            with open(self.root / f"{slot.name}.log", "rb") as f:
                f.seek(slot.log_at)
                text = f.read()
        except OSError:
            return slot.member_ids
        slot.log_at += len(text) - len(text.rpartition(b"\n")[2])
        slot.member_ids |= {m.decode() for m in _MEMBER_ID.findall(text)}
        return slot.member_ids

    def by_name(self, name: str | None) -> Slot | None:
        return next((s for s in self.slots if s.name == name), None)

    def revive(self) -> None:
        """Restart any worker that exited on its own (recorded: the verdict fails on it)."""
        with self.lock:
            for s in self.slots:
                if s.proc is None or s.retired or s.expected_down or s.pid is not None:
                    continue
                code = s.proc.proc.returncode if s.proc.proc is not None else None
                self.exits.append(
                    f"{s.name} (start {s.incarnation}) exited with {code}: {s.proc.tail_log(5)}"
                )
                self.start(s)

    def sample_rss(self) -> None:
        for s in list(self.slots):
            pid = s.pid
            if pid is None:
                continue
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        s.peak_rss_kb = max(s.peak_rss_kb, int(line.split()[1]))
            except (OSError, ValueError):
                pass  # it just exited

    def kill_all(self) -> None:
        """SIGKILL every worker (a SIGSTOPped one too): the soak is being torn down."""
        with self.lock:
            for s in self.slots:
                s.expected_down = True
                if s.proc is not None:
                    s.proc.kill()

    def stop_all(self, timeout: float = 60.0) -> dict[str, int]:
        """SIGCONT then SIGTERM every worker; their exit codes."""
        with self.lock:  # not held while they stop: the watch reads their logs meanwhile
            running = [(s, pid) for s in self.slots if (pid := s.pid) is not None]
            for s, pid in running:
                s.expected_down = True
                os.kill(pid, signal.SIGCONT)
        return {s.name: s.proc.stop(timeout) for s, _ in running if s.proc is not None}


@dataclass
class Fault:
    """A fault whose recovery is timed: these partitions progressed again (or drained)."""

    kind: str
    at: float
    partitions: list[TP]  # empty: all
    committed: dict[TP, int] | None = None  # taken a poll after the fault (commits in flight)
    recovered_s: float | None = None


@dataclass
class GroupWatch:
    """Polls ``group`` every ``interval`` s in a thread of its own; read its fields any time."""

    bootstrap: str
    group: str
    topics: dict[str, int]  # topics (and partitions) the group reads; others are discovered
    plain: set[str]  # of them, those written without transactions (no markers)
    pool: WorkerPool
    interval: float = 1.0
    state: str = ""
    # member id -> (client id, assigned partitions); member id -> (worker, its pid)
    members: dict[str, tuple[str, frozenset[TP]]] = field(default_factory=dict)
    owners: dict[str, tuple[str, int]] = field(default_factory=dict)
    positions: dict[TP, tuple[int, int]] = field(default_factory=dict)  # (committed, end)
    rebalances: int = 0
    kept: int = 0
    longest_stall: tuple[float, TP | None, float] = (0.0, None, 0.0)  # seconds, where, since
    # each partition's holder in the stable assignments seen, from when: (time, "w1 (pid N)")
    holders: dict[TP, list[tuple[float, str]]] = field(default_factory=dict)
    faults: list[Fault] = field(default_factory=list)
    errors: int = 0
    armed: bool = False
    last_ok: float = 0.0  # when a poll last succeeded
    blind: float = 0.0  # the longest time between two successful polls while armed
    _progress: dict[TP, float] = field(default_factory=dict)  # last progress seen
    _at: dict[TP, int] = field(default_factory=dict)  # committed offset at the last look
    targets: dict[TP, int] = field(default_factory=dict)  # offsets to reach (``wait_for``)
    reached: set[TP] = field(default_factory=set)
    _seen: dict[str, float] = field(default_factory=dict)  # member id -> first seen
    _caught: dict[TP, tuple[int, int]] = field(default_factory=dict)  # markers-only positions
    _stable: dict[str, frozenset[TP]] | None = None  # the last stable assignment
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="group-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def arm(self, on: bool = True) -> None:
        """Measure stalls from now (a partition's clock starts at its first look)."""
        self._progress.clear()
        self.last_ok = time.monotonic() if on else self.last_ok
        self.armed = on

    def _run(self) -> None:
        while not self._stop.is_set():  # whatever kills a loop, the next one looks again
            try:
                asyncio.run(self._loop())
            except BaseException:
                self.errors += 1
                time.sleep(1.0)

    async def _loop(self) -> None:
        from aiokafka import AIOKafkaConsumer
        from aiokafka.admin import AIOKafkaAdminClient

        while not self._stop.is_set():
            admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=8000)
            consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, request_timeout_ms=8000)
            reader = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap, request_timeout_ms=8000,
                isolation_level="read_committed", enable_auto_commit=False,
                max_partition_fetch_bytes=64 << 10,
            )  # fmt: skip
            try:
                for client in (admin, consumer, reader):
                    start = retry_transient(client.start, what="watch", bootstrap=self.bootstrap)
                    await asyncio.wait_for(start, 60)
                while not self._stop.is_set():
                    started = time.monotonic()
                    await asyncio.wait_for(self._poll(admin, consumer, reader), 20)
                    self._seen_ok(time.monotonic())
                    self.pool.sample_rss()
                    await asyncio.sleep(max(0.05, self.interval - (time.monotonic() - started)))
            except (Exception, asyncio.CancelledError):  # a broker is down or moving: new
                self.errors += 1  # clients, a moment later
                await asyncio.sleep(1.0)
            finally:
                for close in (reader.stop, consumer.stop, admin.close):
                    with contextlib.suppress(Exception, asyncio.CancelledError):
                        await asyncio.wait_for(close(), 10)

    async def _poll(self, admin: Any, consumer: Any, reader: Any) -> None:
        from aiokafka import TopicPartition
        from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment

        (resp,) = await admin.describe_consumer_groups([self.group])
        (g,) = resp.to_object()["groups"]
        members: dict[str, tuple[str, frozenset[TP]]] = {}
        for m in g["members"]:
            tps: set[TP] = set()
            if m["member_assignment"]:
                decoded = ConsumerProtocolMemberAssignment.decode(m["member_assignment"])
                tps = {(t, p) for t, ps in decoded.assignment for p in ps}
            members[m["member_id"]] = (m["client_id"], frozenset(tps))
        if g["state"] == "Stable":
            self._count_rebalance(members)
        self.state, self.members = g["state"], members
        self._match(members)
        self._note_holders(members, time.monotonic())
        done = await admin.list_consumer_group_offsets(self.group)
        found = {(tp.topic, tp.partition) for tp in done}
        found |= {tp for _, tps in members.values() for tp in tps}
        found |= {(t, p) for t, n in self.topics.items() for p in range(n)}
        tps_all = [TopicPartition(t, p) for t, p in sorted(found)]
        ends = await consumer.end_offsets(tps_all)
        now = time.monotonic()
        quiet = []
        for tp in tps_all:
            meta, key = done.get(tp), (tp.topic, tp.partition)
            now_at = (meta.offset if meta is not None and meta.offset >= 0 else 0, ends[tp])
            if self._caught.get(key) == now_at:  # seen before: markers only up to the end
                now_at = (ends[tp], ends[tp])
            elif tp.topic not in self.plain and self._at.get(key) == now_at[0] < now_at[1]:
                quiet.append((tp, now_at[0], now_at[1]))  # behind, no progress since the last look
            self.positions[key] = now_at
        pending = [(TopicPartition(*k), self.positions[k][0], target)
                   for k, target in self.targets.items() if k not in self.reached]  # fmt: skip
        for k in [k for k, _, target in pending if self.positions[k][0] >= target]:
            self.reached.add(k)
        pending = [q for q in pending if (q[0].topic, q[0].partition) not in self.reached]
        caught = await self._markers_only(reader, quiet + pending)
        for tp, committed, limit in quiet + pending:
            key = (tp.topic, tp.partition)
            if caught.get(key) != (committed, limit):
                continue
            if key in self.targets and limit == self.targets[key]:
                self.reached.add(key)
            if limit == self.positions[key][1]:
                self._caught[key] = self.positions[key]
                self.positions[key] = (limit, limit)
        for key, (committed, end) in self.positions.items():
            if committed >= end or key not in self._progress or committed > self._at.get(key, -1):
                self._progress[key] = now
            elif self.armed and now - self._progress[key] > self.longest_stall[0]:
                self.longest_stall = (now - self._progress[key], key, self._progress[key])
            self._at[key] = committed
        for f in self.faults:
            if f.committed is None and now - f.at >= 0.5:
                keys = f.partitions or list(self.positions)
                f.committed = {tp: self.positions[tp][0] for tp in keys if tp in self.positions}
            elif f.recovered_s is None and now - f.at <= RECOVERY_LIMIT_S and self._moved(f):
                f.recovered_s = now - f.at

    async def _markers_only(
        self, reader: Any, ranges: list[tuple[Any, int, int]]
    ) -> dict[TP, tuple[int, int]]:
        """Of ``(partition, committed, limit)``, the ranges from the committed offset up to
        the limit that hold transaction markers only (a read-committed reader finds no
        record there): caught up. Topics the workers write in transactions end with one."""
        if not ranges:
            return {}
        reader.assign(list({tp for tp, _, _ in ranges}))
        for tp, committed, _ in ranges:
            reader.seek(tp, committed)
        got = await reader.getmany(timeout_ms=1000)
        out: dict[TP, tuple[int, int]] = {}
        for tp, committed, limit in ranges:
            first = got[tp][0].offset if got.get(tp) else await reader.position(tp)
            if first >= limit:
                out[(tp.topic, tp.partition)] = (committed, limit)
        return out

    def _seen_ok(self, now: float) -> None:
        """A poll succeeded: note the longest the watch was blind while armed."""
        if self.armed:
            self.blind = max(self.blind, now - self.last_ok)
        self.last_ok = now

    def fresh(self, since: float) -> bool:
        """Whether a poll succeeded after ``since`` (a decision needs a fresh look)."""
        return self.last_ok > since

    def _moved(self, f: Fault) -> bool:
        """Every partition of ``f`` committed past its offset at the fault, or drained."""
        pos, at = self.positions, f.committed
        if at is None:
            return False
        return all(pos[tp][0] > c or pos[tp][0] >= pos[tp][1] for tp, c in at.items())

    def _match(self, members: dict[str, tuple[str, frozenset[TP]]]) -> None:
        """Map members to workers: the worker's pid in the client id, its member id in the
        worker's log, else by elimination (one member and one worker left unmatched)."""
        live = {s.name: s for s in self.pool.slots if s.pid is not None}
        owners = {m: o for m, o in self.owners.items() if m in members and o[0] in live
                  and live[o[0]].pid == o[1]}  # fmt: skip
        for m, (client, _) in members.items():
            for name, s in live.items():
                pid = s.pid or 0
                if m not in owners and (
                    re.search(rf"(?<!\d){pid}(?!\d)", client) or m in self.pool.read_member_ids(s)
                ):
                    owners[m] = (name, pid)
        now = time.monotonic()
        self._seen = {m: self._seen.get(m, now) for m in members}
        loose = [m for m in members if m not in owners]
        idle = [n for n in live if n not in {o[0] for o in owners.values()}]
        if (
            self.state == "Stable" and len(loose) == 1 and len(idle) == 1
            and self._seen[loose[0]] > live[idle[0]].started_at  # joined after it started
        ):  # fmt: skip
            owners[loose[0]] = (idle[0], live[idle[0]].pid or 0)
        self.owners = owners

    def _note_holders(self, members: dict[str, tuple[str, frozenset[TP]]], now: float) -> None:
        """Each partition's holder in a stable assignment (a worker and its pid: a restarted
        worker is another holder), added to ``holders`` when it changes: a stall's report
        says whose faults it spanned."""
        if self.state != "Stable":
            return
        held: dict[TP, str] = {}
        for m, (_, tps) in members.items():
            name, pid = self.owners.get(m, ("an unmatched member", 0))
            for tp in tps:
                held[tp] = f"{name} (pid {pid})" if pid else name
        for tp in sorted(set(held) | set(self.holders)):
            who, seen = held.get(tp, "nobody"), self.holders.setdefault(tp, [])
            if not seen or seen[-1][1] != who:
                seen.append((now, who))

    def holders_between(self, tp: TP, start: float, end: float) -> list[tuple[float, str]]:
        """``tp``'s holders from ``start`` to ``end``: the one it had at ``start`` (if seen)
        and each one it had after, until ``end``."""
        seen = self.holders.get(tp, [])
        before = [h for h in seen if h[0] <= start][-1:]
        return before + [h for h in seen if start < h[0] <= end]

    def _count_rebalance(self, members: dict[str, tuple[str, frozenset[TP]]]) -> None:
        """Count a new stable assignment; kept: a member holds some partitions it held before."""
        after = {m: tps for m, (_, tps) in members.items()}
        before, self._stable = self._stable, after
        if before is None or before == after:
            return
        if not self.armed:
            return
        self.rebalances += 1
        if any(before[m] & after[m] for m in before.keys() & after.keys()):
            self.kept += 1

    # -- what the driver asks ---------------------------------------------------------
    def stable(self) -> int:
        """Members of the group when it is Stable, else 0."""
        return len(self.members) if self.state == "Stable" else 0

    def wait_stable(self, n: int, timeout: float) -> bool:
        """Wait until the group is stable with ``n`` members, each matched to a live worker."""
        asked = time.monotonic()
        deadline = asked + timeout
        while time.monotonic() < deadline and not self._stop.is_set():
            if self.fresh(asked) and self.stable() == n and len(self.owners) == n:
                return True
            time.sleep(0.5)
        return False

    def reach(self, targets: dict[TP, int]) -> None:
        """From now on, note which partitions committed up to these offsets (``reached``)."""
        self.reached = set()
        self.targets = dict(targets)

    def holder(self, tp: TP) -> str | None:
        """The worker whose member is assigned ``tp`` (None: unknown or unassigned)."""
        member = next((m for m, (_, tps) in self.members.items() if tp in tps), None)
        return self.owners[member][0] if member in self.owners else None

    def held_by(self, worker: str, topic: str) -> list[TP]:
        """``topic``'s partitions assigned to ``worker``'s member (empty: unknown)."""
        mine = [m for m, o in self.owners.items() if o[0] == worker]
        return sorted(tp for m in mine for tp in self.members.get(m, ("", frozenset()))[1]
                      if tp[0] == topic)  # fmt: skip

    def fault(self, kind: str, tps: list[TP]) -> None:
        """Time the recovery of ``tps`` (all partitions when empty) from now."""
        self.faults.append(Fault(kind, time.monotonic(), tps))


@dataclass
class Chaos:
    """Runs ``ACTIONS`` in seeded shuffled rounds with seeded pauses until ``stop()``."""

    seed: int
    pool: WorkerPool
    watch: GroupWatch
    cluster: LocalKafkaCluster
    input_topic: str
    limit_topic: str
    session_timeout: float
    actions: tuple[str, ...] = ACTIONS
    log: Callable[[str], None] = print
    done: list[str] = field(default_factory=list)
    closing: bool = False  # torn down: restart nothing
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="chaos", daemon=True)
        self._thread.start()

    def abort(self, timeout: float) -> bool:
        """Stop without restarting what the fault in hand stopped (the soak is torn down)."""
        self.closing = True
        return self.stop(timeout)

    def stop(self, timeout: float = 240.0) -> bool:
        """Stop after the fault in hand is undone; False if it did not end in time."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def _pause(self, rng: random.Random, lo: float, hi: float) -> bool:
        return not self._stop.wait(rng.uniform(lo, hi))

    def _run(self) -> None:
        rng = random.Random(self.seed)
        while self.actions and not self._stop.is_set():
            for action in rng.sample(self.actions, len(self.actions)):
                if not self._pause(rng, 2.0, 10.0):
                    return
                started = time.monotonic()
                try:
                    note = getattr(self, action)(rng)
                except Exception as exc:  # the fault is undone in its own finally
                    note = f"failed: {exc!r}"
                line = f"{action} {note} ({time.monotonic() - started:.0f}s)"
                self.done.append(line)
                self.log(f"chaos: {line}")

    def _settle(self, n: int) -> str:
        if self._stop.is_set():  # the load is over: the drain waits for the group instead
            return ""
        ok = self.watch.wait_stable(n, 120)
        return "" if ok else f"; group not stable with {n} members within 120s"

    def _kill(self, slot: Slot, kind: str, rng: random.Random) -> str:
        self.watch.fault(kind, self.watch.held_by(slot.name, self.input_topic))
        with self.pool.lock:
            slot.expected_down = True
            if slot.proc is not None:
                slot.proc.kill()
        try:
            self._pause(rng, 1.0, 4.0)
        finally:
            if not self.closing:
                self.pool.start(slot)
        return f"{slot.name} SIGKILLed, restarted" + self._settle(len(self.pool.live(99)))

    def kill_worker(self, rng: random.Random) -> str:
        slot = rng.choice(self.pool.live())
        return self._kill(slot, "worker SIGKILL", rng)

    def kill_limit_holder(self, rng: random.Random) -> str:
        slot = self.pool.by_name(self.watch.holder((self.limit_topic, 0)))
        if slot is None or slot.pid is None:
            return "skipped: no worker is known to hold limit-deaths (members not matched)"
        return "holder of limit-deaths: " + self._kill(slot, "limit-deaths holder SIGKILL", rng)

    def add_remove_worker(self, rng: random.Random) -> str:
        n = len(self.pool.live(99))
        extra = self.pool.add()
        note = f"{extra.name} added" + self._settle(n + 1)
        self._pause(rng, 5.0, 15.0)
        with self.pool.lock:
            extra.expected_down = extra.retired = True
        code = extra.proc.stop(60) if extra.proc is not None else 0
        return note + f", removed (SIGTERM, exit {code})" + self._settle(n)

    def zombie(self, rng: random.Random) -> str:
        slot = rng.choice(self.pool.live())
        pid = slot.pid
        if pid is None:
            return "skipped: no live worker"
        tps = self.watch.held_by(slot.name, self.input_topic)
        os.kill(pid, signal.SIGSTOP)
        self.watch.fault("zombie SIGSTOP", tps)
        try:
            self._stop.wait(self.session_timeout + rng.uniform(3.0, 8.0))  # past the timeout
        finally:
            os.kill(pid, signal.SIGCONT)
        return f"{slot.name} SIGSTOPped past the session timeout, SIGCONTed" + self._settle(
            len(self.pool.live(99))
        )

    def kill_broker(self, rng: random.Random) -> str:
        node = rng.choice([n.node_id for n in self.cluster.nodes])
        self.watch.fault("broker SIGKILL", [])
        self.cluster.kill(node)
        try:
            self._pause(rng, 2.0, 6.0)
        finally:
            started = time.monotonic()
            if not self.closing:
                self.cluster.start(node, timeout=120)
        back = time.monotonic() - started
        if self.closing:
            return f"node {node} SIGKILLed, left down (the soak is torn down)"
        synced = self.cluster.wait_in_sync([self.input_topic], timeout=120)
        return f"node {node} SIGKILLed, back in {back:.0f}s, in sync {synced:.0f}s later"
