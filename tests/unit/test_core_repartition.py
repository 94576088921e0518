"""Every run in one place, whatever the producer's key (schemas/CONTRACT.md, "Transport").

An ``Intake`` that routes applies a record only on its home partition (the Java client's
partitioner on ``runId``; ``operationId``, or ``connectionId`` for a denial); one found
elsewhere is forwarded, and its copy is stepped on the home lane with ``forwarded=True``.

The property: a fleet split over partitions by producers that key and hash otherwise
(event ids, null keys, librdkafka's CRC-32, Sarama's FNV-1a), stepped lane by lane in any
order, its forwarded copies stepped at any later time, gives the file path's ledger and
exhaustion alerts; every input offset ends in exactly one of the ledger, quarantine, the
DLQ or forwarded, and every copy in one of the first three. ``_Worker`` plays the worker:
one intake, a queue per input partition and per repartition partition, a lane reported
behind while either of its queues holds records, and the copies on their way held at
their time either by the harness (the earliest one waiting) or, drawn, by the intake's
own holds alone, released as the worker releases them (nothing waits on the queue).
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from prism.pipeline.core import (
    RULE_EXHAUSTION,
    CoreConfig,
    EventClock,
    ExhaustionAlerter,
    Forward,
    InRecord,
    Intake,
    Output,
    home_partition,
    lane_record,
)
from prism.pipeline.core._route import crc32_partition, sarama_partition
from prism.pipeline.ingest import ingest_lines
from prism.runtime.simulator import FleetConfig, simulate
from tests.fixtures.final_ledger import PROCESSING_FIELDS, FinalLedger
from tests.fixtures.hostile import fleets
from tests.fixtures.runs import NOW, RunBuilder

INPUT, REPARTITION = "prism.agent-events", "prism.agent-events.repartition"
PRODUCERS = ("home", "eventId", "null", "crc32", "fnv1a")
CHANNEL_TABLES = ("channel_operations", "channel_denials", "channel_quarantine")


@dataclasses.dataclass
class Placed:
    """A record as a producer put it on the input topic."""

    value: bytes
    key: bytes | None
    partition: int


def _routing(value: bytes) -> tuple[bytes, bytes] | None:
    """(routing key, event id) of a record that parses as JSON with them; else None."""
    try:
        ev = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(ev, dict):
        return None
    key = ev.get("runId")
    if str(ev.get("schema", "")).startswith("prism.channel-operation"):
        key = ev.get("operationId") or ev.get("connectionId")
    eid = ev.get("eventId")
    if not isinstance(key, str) or not isinstance(eid, str):
        return None
    return key.encode(), eid.encode()


def place(
    values: Sequence[bytes], producers: Sequence[str], nulls: Sequence[int], k: int
) -> list[Placed]:
    """Each value as the drawn producer would place it on ``k`` partitions."""
    out = []
    for i, value in enumerate(values):
        producer, null_at = producers[i % len(producers)], nulls[i % len(nulls)] % k
        ids = _routing(value)
        if ids is None:  # junk: whatever key its producer meant, any partition
            out.append(Placed(value, None, null_at))
            continue
        key, eid = ids
        if producer == "home":
            out.append(Placed(value, key, home_partition(key, k)))
        elif producer == "eventId":
            out.append(Placed(value, eid, home_partition(eid, k)))
        elif producer == "null":
            out.append(Placed(value, None, null_at))
        elif producer == "crc32":
            out.append(Placed(value, key, crc32_partition(key, k)))
        else:
            out.append(Placed(value, key, sarama_partition(key, k)))
    return out


class _Worker:
    """One process holding every lane: the input and repartition partitions as queues."""

    def __init__(
        self, config: CoreConfig, k: int, placed: Sequence[Placed], *, own_holds: bool = False
    ) -> None:
        self.own_holds = own_holds  # the intake's own holds only, released as the worker does
        alerter = ExhaustionAlerter(
            config.alert_window_s, config.alert_threshold, config.lateness_s
        )
        self.intake = Intake(config, alerter=alerter, route_partitions=k)
        self.k = k
        self.ledger = FinalLedger()
        self.fed: list[InRecord] = []
        self.copies: list[InRecord] = []
        self.forwards: list[Forward] = []
        self.queues: dict[tuple[int, bool], list[InRecord]] = {}
        for p in range(k):
            self.intake.processor(p)
            self.queues[(p, False)], self.queues[(p, True)] = [], []
        for rec in placed:
            q = self.queues[(rec.partition, False)]
            q.append(InRecord(rec.value, INPUT, rec.partition, len(q), key=rec.key))
            self.fed.append(q[-1])
        self.read = dict.fromkeys(self.queues, 0)
        self.copy_ts: dict[int, list[int]] = {p: [] for p in range(k)}

    def waiting(self) -> list[tuple[int, bool]]:
        return [q for q, recs in self.queues.items() if self.read[q] < len(recs)]

    def step(self, queue: tuple[int, bool], size: int, now: float) -> Output:
        for (p, copies), recs in self.queues.items():  # records waiting hold the watermark
            self.intake.behind(p, self.read[(p, copies)] < len(recs), forwarded=copies)
            if copies and not self.own_holds:  # and the copies on their way, at their time
                waiting = self.copy_ts[p][self.read[(p, copies)] :]
                self.intake.hold(p, min(waiting, default=None))
        lane, forwarded = queue
        start = self.read[queue]
        batch = self.queues[queue][start : start + size]
        self.read[queue] = start + len(batch)
        out = self.intake.step(lane, batch, now, forwarded=forwarded)
        self.intake.commit(lane)
        self.ledger.add(out)
        for f in out.forwards:  # produced to the repartition topic, keyed by the run
            q = self.queues[(f.partition, True)]
            q.append(InRecord(f.value, REPARTITION, f.partition, len(q), key=f.key))
            self.copies.append(q[-1])
            self.copy_ts[f.partition].append(f.ts_us)
        self.forwards += out.forwards
        return out

    def finish(self, now: float) -> None:
        for p, copies in self.queues:
            self.intake.behind(p, False, forwarded=copies)
            self.intake.hold(p, None)
        self.ledger.add(self.intake.finalize(now))


def _meaning(ledger: FinalLedger) -> dict[str, object]:
    snap = ledger.snapshot()
    dead = snap.pop("dead_letters")
    for table in CHANNEL_TABLES:
        rows = [
            tuple(sorted((k, repr(v)) for k, v in dataclasses.asdict(r).items()
                         if k not in PROCESSING_FIELDS))
            for r in ledger.rows(table)
        ]  # fmt: skip
        snap[table] = sorted(rows)
    return {**snap, "dead_letters": sorted(set(dead)), "billing": ledger.billing()}


def _exhaustion(ledger: FinalLedger) -> list[tuple[str, str, str, float | None]]:
    return sorted(
        (a.alert_id, a.state, a.ts.isoformat(), a.value)
        for a in ledger.rows("alerts")
        if a.rule == RULE_EXHAUSTION
    )


def file_path(values: Sequence[bytes], config: CoreConfig, now: float) -> FinalLedger:
    """The ledger ``ingest-file`` writes of ``values`` as lines (none blank: a file skips
    those, where an empty Kafka record is dead-lettered)."""
    assert all(v.strip() for v in values)
    ledger = FinalLedger()
    ingest_lines(values, source="file:f", store=ledger.add, config=config, clock=lambda: now)
    return ledger


def play(w: _Worker, data: st.DataObject, now: float) -> None:
    """Step the lanes in a drawn order: input batches, copies whenever drawn."""
    rnd = data.draw(st.randoms(use_true_random=False))
    while waiting := w.waiting():
        w.step(rnd.choice(waiting), rnd.randint(1, 8), now)
    w.finish(now)


def assert_accounted(w: _Worker) -> None:
    """Every input offset in one of ledger / quarantine / DLQ / forwarded; copies in one of
    the first three (agent events: their run and id in the ledger's events xor quarantine)."""
    dead = {(d.source, d.partition, d.offset) for d in w.ledger.rows("dead_letters")}
    forwarded = Counter(f.source for f in w.forwards)
    assert all(n == 1 for n in forwarded.values()), forwarded
    assert len(w.copies) == len(w.forwards)
    accepted, quarantined = w.ledger.placed_events()
    assert not accepted & quarantined
    for rec in [*w.fed, *w.copies]:
        where = (rec.source, rec.partition, rec.offset)
        places = (where in dead) + (where in forwarded)
        assert places <= 1, where
        assert rec.source == INPUT or where not in forwarded  # a copy is never forwarded
        if places:
            continue
        ev = orjson.loads(rec.value or b"{}")
        if ev.get("schema") == "prism.agent-event/v1":
            event = (ev["runId"], ev["eventId"])
            assert (event in accepted) != (event in quarantined), event


def _without_seq_claims(values: Sequence[bytes]) -> list[bytes]:
    """The values but a second event claiming a run's ``seq`` (a re-sent event id stays).

    Between claims carrying different tenants, arrival decides (rule 11 fixes the owner by
    the run's first event), so the holder depends on how records reach their lane, the one
    place rule 10 does not reach. Between duplicates (the same tenant field) the smaller
    ``eventId`` holds the seq, but only while the run keeps its facts: one arriving after
    the run shrank to a tombstone is quarantined ``duplicate_seq`` whatever its id, so a
    copy that comes late still changes the holder (2 of 300 seeded fleets).
    """
    first: dict[tuple[str, object], object] = {}
    kept = []
    for value in values:
        try:
            ev = orjson.loads(value)
        except orjson.JSONDecodeError:
            ev = None
        if isinstance(ev, dict) and ev.get("schema") == "prism.agent-event/v1":
            claim = (str(ev.get("runId")), ev.get("seq"))
            if first.setdefault(claim, ev.get("eventId")) != ev.get("eventId"):
                continue
        kept.append(value)
    return kept


@dataclasses.dataclass(frozen=True, repr=False)
class SimFleet:
    """A drawn fleet's values, core config and processing clock, shown by the simulator
    config that rebuilds them: Hypothesis prints a failing case's arguments, and the
    values alone run to 80 kB."""

    values: list[bytes]
    config: CoreConfig
    now: float
    sim: FleetConfig

    def __repr__(self) -> str:
        return f"SimFleet({self.sim!r}, {len(self.values)} values)"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # Hypothesis prints by this
        p.text(repr(self))


@st.composite
def fleet_values(draw: st.DrawFn) -> SimFleet:
    """A small chaotic simulated fleet (channel operations and a burst of limit deaths
    included), its config and processing clock."""
    runs = draw(st.integers(3, 20))
    cfg = FleetConfig(
        runs=runs,
        seed=draw(st.integers(0, 2**16)),
        duplicates=draw(st.sampled_from([0.0, 0.1])),
        reorder_window=draw(st.integers(0, 6)),
        post_terminal=draw(st.sampled_from([0.0, 0.3])),
        conflicting_terminals=draw(st.sampled_from([0.0, 0.3])),
        hostile=draw(st.sampled_from([0.0, 0.1])),
        malformed=draw(st.sampled_from([0.0, 0.05])),
        channel_operations=draw(st.sampled_from([0, 6])),
        limit_death_burst=draw(st.sampled_from([0, min(runs, 4)])),
        alert_threshold=3,
        stale_after_seconds=draw(st.sampled_from([60, 3600])),
    )
    try:
        fleet = simulate(cfg)
    except ValueError:  # the simulator's channel operations need a span it may not have:
        reject()  # runtime/simulator/_channels.py asks randint(start, end - 80 min)
    config = CoreConfig(
        stale_after_s=cfg.stale_after_seconds,
        alert_threshold=cfg.alert_threshold,
        alert_window_s=cfg.alert_window_seconds,
        processing_grace=False,
    )
    now = max(r.ts_ms for r in fleet.records) / 1000
    values = _without_seq_claims([r.value for r in fleet.records if r.value.strip()])
    return SimFleet(values, config, now, cfg)


@st.composite
def splits(draw: st.DrawFn, n: int) -> tuple[int, list[str], list[int]]:
    k = draw(st.integers(2, 5))
    producers = draw(st.lists(st.sampled_from(PRODUCERS), min_size=1, max_size=min(n, 24) or 1))
    nulls = draw(st.lists(st.integers(0, 63), min_size=1, max_size=min(n, 24) or 1))
    return k, producers, nulls


_SETTINGS = settings(
    deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


@_SETTINGS
@given(fleet=fleet_values(), data=st.data())
def test_a_fleet_split_by_any_producer_gives_the_file_paths_ledger_and_alerts(
    fleet: SimFleet, data: st.DataObject
) -> None:
    values, config, now = fleet.values, fleet.config, fleet.now
    expected = file_path(values, config, now)
    k, producers, nulls = data.draw(splits(len(values)))
    w = _Worker(config, k, place(values, producers, nulls, k), own_holds=data.draw(st.booleans()))
    play(w, data, now)
    assert _meaning(w.ledger) == _meaning(expected)
    assert _exhaustion(w.ledger) == _exhaustion(expected)
    assert_accounted(w)


@_SETTINGS
@given(values=fleets(), data=st.data())
def test_hostile_runs_split_by_any_producer_give_the_file_paths_ledger(
    values: list[bytes], data: st.DataObject
) -> None:
    values = [v for v in values if v.strip()]
    # these runs interleave over hours of event time in one stream, far beyond the allowed
    # lateness: a batch cut decides an alert before a death read later (rule 16 counts it
    # late), on the file path as anywhere; a lateness beyond the span leaves nothing late
    config = CoreConfig(alert_threshold=2, allowed_lateness_s=86400, processing_grace=False)
    expected = file_path(values, config, NOW)
    k, producers, nulls = data.draw(splits(len(values)))
    w = _Worker(config, k, place(values, producers, nulls, k), own_holds=data.draw(st.booleans()))
    play(w, data, NOW)
    assert _meaning(w.ledger) == _meaning(expected)
    assert _exhaustion(w.ledger) == _exhaustion(expected)
    assert_accounted(w)


def _home_only(values: Sequence[bytes], k: int) -> list[Placed]:
    return place(values, ["home"], [0], k)


@_SETTINGS
@given(fleet=fleet_values(), k=st.integers(1, 4), size=st.integers(1, 50))
def test_with_every_record_at_home_routing_changes_no_output(
    fleet: SimFleet, k: int, size: int
) -> None:
    values, config, now = fleet.values, fleet.config, fleet.now
    outs: list[list[Output]] = []
    for route in (None, k):
        intake = Intake(config, route_partitions=route)
        lanes: dict[int, list[InRecord]] = {}
        for rec in _home_only(values, k):
            q = lanes.setdefault(rec.partition, [])
            q.append(InRecord(rec.value, INPUT, rec.partition, len(q), key=rec.key))
        steps = []
        for p, recs in sorted(lanes.items()):
            for i in range(0, len(recs), size):
                steps.append(intake.step(p, recs[i : i + size], now))
                intake.commit(p)
        steps.append(intake.finalize(now))
        outs.append(steps)
    assert outs[0] == outs[1]
    assert not any(o.forwards for o in outs[1])


def test_the_property_sees_every_producer_pattern() -> None:
    """The splits above do put records off their home, by each pattern (a sanity check
    that the property exercises forwarding at all)."""
    rng = random.Random(7)
    values = [orjson.dumps(RunBuilder(f"run-{i}").started().events[0]) for i in range(200)]
    placed = place(values, PRODUCERS, [rng.randrange(64) for _ in range(200)], 4)
    w = _Worker(CoreConfig(), 4, placed)
    patterns: Counter[str] = Counter()
    for p in range(4):
        patterns.update(w.step((p, False), 10**6, NOW).patterns)
    assert set(patterns) == {
        "null key",
        "key is not the runId (e.g. eventId)",
        "librdkafka default partitioner (CRC32)",
        "Sarama default partitioner (FNV-1a)",
    }, patterns


# -- by hand: what a forward carries, duplicates, offsets and marks per source ----------------

K = 4


def _off_home(key: bytes) -> tuple[int, int]:
    """(home, another partition) of a routing key on ``K`` partitions."""
    home = home_partition(key, K)
    return home, (home + 1) % K


def _copy(f: Forward, offset: int) -> InRecord:
    return InRecord(f.value, REPARTITION, f.partition, offset, key=f.key)


def _channel(op: str | None, state: str, eid: str, seq: int = 0, minutes: float = 0) -> bytes:
    """A channel operation's record, ``minutes`` after 10:00."""
    ts = datetime(2026, 11, 30, 10, tzinfo=UTC) + timedelta(minutes=minutes)
    rec = {
        "schema": "prism.channel-operation/v1",
        "eventId": eid,
        "seq": seq,
        "ts": ts.isoformat(),
        "connectionId": "telegram:main",
        "kind": "message",
        "state": state,
        **({"operationId": op} if op else {"reason": "capacity"}),
    }
    return orjson.dumps(rec)


def test_a_record_off_its_home_is_forwarded_with_its_source_and_counted() -> None:
    intake = Intake(CoreConfig(processing_grace=False), route_partitions=K)
    value = orjson.dumps(RunBuilder("r1").started().events[0])
    home, off = _off_home(b"r1")
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    out = intake.step(off, [InRecord(value, INPUT, off, 7, key=b"r1-e0", traceparent=tp)], NOW)
    (f,) = out.forwards
    assert (f.partition, f.channel, f.key, f.value, f.source) == (home, False, b"r1", value,
                                                                  (INPUT, off, 7))  # fmt: skip
    assert dict(f.headers) == {
        "source-topic": INPUT.encode(),
        "source-partition": str(off).encode(),
        "source-offset": b"7",
        "traceparent": tp.encode(),
    }
    assert f.pattern == "key is not the runId (e.g. eventId)"
    assert (out.forwarded, out.patterns) == (Counter({off: 1}), Counter({f.pattern: 1}))
    assert out.ranges == [(INPUT, off, 7, 7)]  # the offset is handled: forwarded
    assert not out.ledger.events and not out.dlq and intake.next_offset(off, INPUT) == 8
    copy = intake.step(home, [_copy(f, 0)], NOW, forwarded=True)
    assert [e.event_id for e in copy.ledger.events] == ["r1-e0"] and not copy.forwards
    assert (intake.next_offset(home, REPARTITION), intake.next_offset(home, INPUT)) == (1, None)


def test_channel_operations_route_by_operation_and_denials_by_connection() -> None:
    intake = Intake(CoreConfig(processing_grace=False), route_partitions=K)
    op_home, op_off = _off_home(b"op-1")
    out = intake.step(op_off, [InRecord(_channel("op-1", "admitted", "c1"), INPUT, op_off, 0)],
                      NOW)  # fmt: skip
    assert [(f.partition, f.channel, f.key, f.pattern) for f in out.forwards] == [
        (op_home, True, b"op-1", "null key")
    ]
    deny_home, deny_off = _off_home(b"telegram:main")
    out = intake.step(deny_off, [InRecord(_channel(None, "denied", "c2"), INPUT, deny_off, 0,
                                          key=b"c2")], NOW)  # fmt: skip
    assert [(f.partition, f.key, f.pattern) for f in out.forwards] == [
        (deny_home, b"telegram:main", "key is not the connectionId (e.g. eventId)")
    ]


def _stuck(outs: Sequence[Output], op: str) -> list[bool]:
    return [r.stuck for o in outs for r in o.ledger.channel_operations if r.operation_id == op]


@pytest.mark.parametrize("base", [0, 1 << 16])
def test_a_channel_operation_on_its_way_holds_the_watermark_at_its_home(base: int) -> None:
    """A channel operation found off its home holds the watermark at its time on the
    home's channel lane (``channel_lane`` + home) until it is applied, as an agent
    event's copy does: an operation executing at home is not flagged ``stuck`` past its
    completion still on its way, however far the other lanes moved on."""
    config = CoreConfig(processing_grace=False, channel_stuck_s=600)
    intake = Intake(config, route_partitions=K, channel_lane=base)
    home, off = _off_home(b"op-1")
    other = next(f"op-{i}" for i in range(2, 99) if home_partition(f"op-{i}".encode(), K) == off)
    started = [_channel("op-1", "admitted", "e0", 0, 0),
               _channel("op-1", "executing", "e1", 1, 1)]  # fmt: skip
    intake.step(base + home, [InRecord(v, INPUT, home, i, key=b"op-1")
                              for i, v in enumerate(started)], NOW)  # fmt: skip
    intake.commit(base + home)
    elsewhere = [_channel("op-1", "delivered", "e2", 2, 5),  # keyed by its event id
                 _channel(other, "admitted", "e3", 0, 60)]  # fmt: skip
    out = intake.step(base + off, [InRecord(v, INPUT, off, i, key=b"e%d" % i)
                                   for i, v in enumerate(elsewhere)], NOW)  # fmt: skip
    intake.commit(base + off)
    (f,) = out.forwards
    assert (f.channel, f.partition, intake.home_lane(f)) == (True, home, base + home)
    assert intake.held(base + home) == f.ts_us  # an hour of other lanes' time: held at it
    assert intake.clock.watermark_us == f.ts_us < intake.clock.top_us
    assert intake.sent_hold() == f.ts_us  # in its lanes' reports
    ticked = intake.tick(NOW + 1)
    assert not any(_stuck(list(ticked.values()), "op-1"))
    applied = intake.step(base + home, [_copy(f, 0)], NOW + 2, forwarded=True)
    intake.commit(base + home)
    assert _stuck([applied], "op-1") == [False]
    intake.behind(base + home, False, forwarded=True)  # nothing more waits there: released
    assert intake.held(base + home) is None and intake.clock.watermark_us == intake.clock.top_us


def test_what_does_not_parse_is_dead_lettered_where_it_arrives_and_copies_stay() -> None:
    intake = Intake(CoreConfig(processing_grace=False), route_partitions=K)
    _, off = _off_home(b"r1")
    out = intake.step(off, [InRecord(b"{nope", INPUT, off, 3, key=b"r1")], NOW)
    assert not out.forwards
    assert [(d.source, d.partition, d.offset) for d in out.ledger.dead_letters] == [(INPUT, off, 3)]
    value = orjson.dumps(RunBuilder("r1").started().events[0])  # a copy off its home too
    out = intake.step(off, [InRecord(value, REPARTITION, off, 0)], NOW, forwarded=True)
    assert not out.forwards and [e.event_id for e in out.ledger.events] == ["r1-e0"]


def _deliver(intake: Intake, ledger: FinalLedger, forwards: list[Forward], at: int) -> Output:
    out = Output()
    for i, f in enumerate(forwards):
        out.extend(intake.step(f.partition, [_copy(f, at + i)], NOW, forwarded=True))
        intake.commit(f.partition)
    ledger.add(out)
    return out


@pytest.mark.parametrize("grace_s", [86400.0, 0.0])  # the run kept whole, or a tombstone
def test_a_copy_delivered_again_changes_no_output(grace_s: float) -> None:
    """A crash between producing the copies and committing their source offsets produces
    them again: the second delivery (new repartition offsets) writes no row, quarantines
    nothing again and sends no alert (rule 1, by event id)."""
    config = CoreConfig(grace_period_s=grace_s, alert_threshold=1, processing_grace=False)
    intake = Intake(config, alerter=ExhaustionAlerter(300, 1, 0), route_partitions=K)
    run = RunBuilder("r1").started().turn(1).limit_death("maxTurns").turn(2)  # post-terminal
    later = RunBuilder("r2", start=RunBuilder("r1").start.replace(hour=12)).started()
    values = [orjson.dumps(e) for e in [*run.events, *later.events]]
    _, off = _off_home(b"r1")
    batch = [InRecord(v, INPUT, off, i) for i, v in enumerate(values)]
    first = intake.step(off, batch, NOW)
    intake.rollback(off)  # the crash: the source offsets were not committed
    again = intake.step(off, batch, NOW)
    intake.commit(off)
    assert first.forwards == again.forwards and again.forwards
    ledger = FinalLedger()
    once = _deliver(intake, ledger, again.forwards, 0)
    for p in range(K):  # every copy applied: nothing on its way holds the watermark
        intake.behind(p, False, forwarded=True)
    for p, ticked in intake.tick(NOW).items():
        intake.commit(p)
        ledger.add(ticked)
        once.extend(ticked)
    assert once.ledger.quarantine and once.limit_deaths and once.ledger.alerts
    before = _meaning(ledger)
    kept = intake.processors[home_partition(b"r1", K)].thawed()["r1"]
    assert (kept.tombstone is None) == (grace_s > 0)  # its facts, or only its event ids
    twice = _deliver(intake, ledger, first.forwards, len(again.forwards))
    assert twice.ledger == type(twice.ledger)()  # no row of any table
    assert (twice.quarantined, twice.closed, twice.alerts, twice.limit_deaths) == ([], [], [],
                                                                                    [])  # fmt: skip
    assert twice.stats["duplicate"] == len(values)
    assert _meaning(ledger) == before


def test_a_denial_copy_delivered_again_is_one_denial() -> None:
    intake = Intake(CoreConfig(processing_grace=False), route_partitions=K)
    _, off = _off_home(b"telegram:main")
    f = intake.step(off, [InRecord(_channel(None, "denied", "c2"), INPUT, off, 0)], NOW).forwards
    ledger = FinalLedger()
    _deliver(intake, ledger, f, 0)
    out = _deliver(intake, ledger, f, 1)
    assert len(ledger.rows("channel_denials")) == 1 and not out.ledger.channel_denials


def test_next_offsets_are_kept_per_source_and_the_old_format_is_read() -> None:
    config = CoreConfig(processing_grace=False)
    intake = Intake(config, route_partitions=K)
    home = home_partition(b"r1", K)
    values = [orjson.dumps(e) for e in RunBuilder("r1").started().turn(1).events]
    intake.step(home, [InRecord(values[0], INPUT, home, 40)], NOW)
    intake.commit(home)
    out = intake.step(home, [InRecord(values[1], REPARTITION, home, 2)], NOW, forwarded=True)
    assert (intake.next_offset(home, INPUT), intake.next_offset(home, REPARTITION)) == (41, 3)
    intake.rollback(home)
    assert (intake.next_offset(home, INPUT), intake.next_offset(home, REPARTITION)) == (41, None)
    out = intake.step(home, [InRecord(values[1], REPARTITION, home, 2)], NOW, forwarded=True)
    intake.commit(home)
    restored = Intake(config, route_partitions=K)
    state = {k: v for k, v in out.state_writes.items() if v is not None}
    restored.load(home, state.items())
    assert (restored.next_offset(home, INPUT), restored.next_offset(home, REPARTITION)) == (41, 3)
    assert restored.lane_report(home, idle=True) == intake.lane_report(home, idle=True)
    old = [(f"m\x1f{home}", b'{"wm": 5, "no": 42}')]  # written before sources were apart
    legacy = Intake(config, route_partitions=K)
    legacy.load(home, old, source=INPUT)
    assert (legacy.next_offset(home, INPUT), legacy.next_offset(home, REPARTITION)) == (42, None)
    unnamed = Intake(config)
    unnamed.load(home, old)
    assert (unnamed.next_offset(home), unnamed.next_offset(home, INPUT)) == (42, None)


def test_each_source_with_records_waiting_holds_the_watermark_at_its_own_mark() -> None:
    intake = Intake(CoreConfig(processing_grace=False), route_partitions=K)
    early = RunBuilder("r1").started().events[0]
    late = RunBuilder("r2", start=RunBuilder("r1").start.replace(hour=11)).started().events[0]
    home = home_partition(b"r1", K)
    intake.step(home, [InRecord(orjson.dumps(early), INPUT, home, 0)], NOW)
    intake.step(home, [InRecord(orjson.dumps(late), REPARTITION, home, 0)], NOW, forwarded=True)
    t_early, t_late = intake.clock.mark(home), intake.lane_report(home, idle=True).mark_us
    assert t_early < t_late == intake.clock.watermark_us
    intake.behind(home, True)  # the input is behind: held at its mark, not the copies'
    assert intake.clock.watermark_us == t_early
    assert intake.lane_report(home, idle=False).mark_us == t_early
    intake.behind(home, False)
    intake.hold(home, t_early + 1)  # a copy of that time is on its way
    assert intake.clock.watermark_us == t_early + 1
    assert intake.lane_report(home, idle=True).pending_us == t_early + 1
    intake.hold(home, None)
    assert intake.clock.watermark_us == t_late


def test_copies_sent_to_a_lane_another_process_holds_hold_that_process_too() -> None:
    # the sender's clock holds the copy's home at its time; its lane reports carry that
    # hold, so the process holding the home lane does not shrink or expire a run past a
    # copy still on its way (seen in the chaos soak: a smaller-id claim of a seq arrived
    # after the run had shrunk and lost to the claim already applied)
    sender = Intake(CoreConfig(processing_grace=False), route_partitions=K)
    value = orjson.dumps(RunBuilder("r1").started().events[0])
    home, off = _off_home(b"r1")
    out = sender.step(off, [InRecord(value, INPUT, off, 7, key=b"r1-e0")], NOW)
    (f,) = out.forwards
    sent = sender.sent_hold()
    assert sent is not None and sent == f.ts_us
    report = sender.lane_report(off, idle=True, hold_us=sent)
    record = lane_record(off, report, 5.0)
    assert orjson.loads(record.value or b"")["hold"] == sent
    home_clock = EventClock()
    home_clock.set_mark(home, sent + 10_000_000)  # the home lane moved on, caught up
    home_clock.remote(off, report.mark_us, idle=True)  # an idle sender holds nothing...
    assert home_clock.watermark_us == sent + 10_000_000
    home_clock.remote(off, report.mark_us, idle=True, hold_us=report.hold_us)  # ...but this
    assert home_clock.watermark_us == sent


def test_a_hold_for_copies_in_flight_outlives_the_home_lane_moving_away() -> None:
    # the home lane was held here when the copy was forwarded, then moved to another
    # process before the copy was applied: the hold stays (in this process's reports
    # all along) until that process reports the copy applied
    sender = Intake(CoreConfig(processing_grace=False), route_partitions=K)
    value = orjson.dumps(RunBuilder("r1").started().events[0])
    home, off = _off_home(b"r1")
    sender.processor(home)  # the home lane is held here too
    (f,) = sender.step(off, [InRecord(value, INPUT, off, 7, key=b"r1-e0")], NOW).forwards
    assert sender.sent_hold() == f.ts_us  # its own lane, reported all the same
    sender.drop(home)  # revoked before the copy was applied
    assert sender.sent_hold() == f.ts_us
