"""The ``hostile`` knob: producers that break the assumptions a naive pipeline makes.

Each chosen run gets one kind (every kind at least once when a run fits it):

- ``reorder_terminal``: a priced usage row after the terminal (higher ``seq``) is
  delivered *before* the terminal; it is post-terminal all the same.
- ``late_tenant``: the first 1-3 events omit ``tenantId``/``accountId``/``userId``.
- ``clock_skew``: from some event on, the producer stamps ``ts`` in the year 2199.
- ``run_id_collision``: a later run of another tenant reuses the run's ``runId`` with its
  own seqs from 0 (its eventIds sort after the owner's).
- ``duplicate_usage``: a reported provider-turn usage row is sent again under a new
  ``eventId`` (and ``seq``), with the same or a new ``entryId``.
- ``quiet_partition``: a run without a terminal gets a run id that hashes (Kafka's
  murmur2 partitioner, ``partitions`` partitions) to a partition no other run uses, so
  that partition receives nothing after the run's last event.

Everything here edits the generated runs before they are encoded, except the early
delivery of ``reorder_terminal`` rows, which ``reorder_early`` applies to the records.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from aiokafka.partitioner import DefaultPartitioner

from ._builder import RunBuilder, format_ts, hex_id, uuid7
from ._catalog import AGENTS, MODELS, TENANTS
from ._chaos import FleetRecord
from ._config import FleetConfig
from ._runs import RunGen
from ._scenarios import RunPlan

__all__ = ["HOSTILE_KINDS", "HostilePlan", "apply_hostile", "partition_of", "reorder_early"]

HOSTILE_KINDS = (
    "reorder_terminal",
    "late_tenant",
    "clock_skew",
    "run_id_collision",
    "duplicate_usage",
    "quiet_partition",
)
# 2199-06-01T00:00:00Z: inside the contract's ts range, far beyond any clock skew.
SKEW_BASE_MS = 7_239_628_800_000
_OWNERSHIP = ("tenantId", "accountId", "userId")
_TERMINALS = frozenset({"agent_finished", "agent_denied", "error"})
_partitioner = DefaultPartitioner()


def partition_of(run_id: str, partitions: int) -> int:
    """The partition Kafka's default partitioner gives a record keyed by ``run_id``."""
    return int(_partitioner(run_id.encode(), list(range(partitions)), list(range(partitions))))


@dataclass(slots=True)
class HostilePlan:
    """What the hostile knob did: run id -> kind, notes per eventId, rows to deliver early."""

    kinds: dict[str, str] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    early: set[str] = field(default_factory=set)
    quiet_partition: int | None = None


def _reported_usage_indexes(b: RunBuilder) -> list[int]:
    end = b.terminal_index if b.terminal_index is not None else 0
    return [
        i
        for i in range(end)
        if b.events[i][1]["type"] == "usage_recorded"
        and b.events[i][1]["data"]["scope"] == "provider_turn"
        and not b.events[i][1]["data"]["usage"].get("estimated")
    ]


def _eligible(g: RunGen) -> list[str]:
    b, plan = g.b, g.plan
    if plan.burst:
        return []
    finished = b.terminal_index is not None
    top_level = "parent" not in b.events[0][1] and plan.child is None
    kinds = []
    if finished:
        kinds.append("reorder_terminal")
    if len(b.events) >= 4:
        kinds.append("late_tenant")
    if plan.outcome != "limit_death":
        kinds.append("clock_skew")
    if finished and top_level:
        kinds.append("run_id_collision")
    if finished and _reported_usage_indexes(b):
        kinds.append("duplicate_usage")
    if not finished and plan.outcome == "stale":
        kinds.append("quiet_partition")
    return kinds


def apply_hostile(
    rng: random.Random, gens: list[RunGen], cfg: FleetConfig
) -> tuple[HostilePlan, list[RunBuilder]]:
    """Choose and apply hostile kinds; return the plan and the extra (colliding) runs."""
    plan = HostilePlan()
    eligible = [_eligible(g) for g in gens]
    chosen: dict[int, str] = {}
    for i, kinds in enumerate(eligible):
        if kinds and rng.random() < cfg.hostile:
            chosen[i] = rng.choice(kinds)
    for kind in HOSTILE_KINDS:
        if kind not in chosen.values():
            pool = [i for i, kinds in enumerate(eligible) if kind in kinds and i not in chosen]
            if pool:
                chosen[rng.choice(pool)] = kind
    plan.quiet_partition = cfg.partitions - 1
    quiet = {i for i, kind in chosen.items() if kind == "quiet_partition"}
    _rename_runs(rng, gens, quiet, cfg.partitions, plan.quiet_partition)
    extra: list[RunBuilder] = []
    for i, kind in sorted(chosen.items()):
        b = gens[i].b
        plan.kinds[b.run_id] = kind
        if kind == "reorder_terminal":
            _post_terminal_usage(b, plan)
        elif kind == "late_tenant":
            _late_tenant(rng, b, plan)
        elif kind == "clock_skew":
            _clock_skew(rng, b, plan)
        elif kind == "run_id_collision":
            extra.append(_collision(rng, gens[i], plan))
        elif kind == "duplicate_usage":
            _duplicate_usage(rng, b, plan)
        else:
            plan.notes.update((ev["eventId"], kind) for _, ev in b.events)
    return plan, extra


def _rename_runs(
    rng: random.Random, gens: list[RunGen], quiet: set[int], partitions: int, target: int
) -> None:
    """Give quiet runs ids on ``target`` and move every other run off it."""
    mapping: dict[str, str] = {}
    for i, g in enumerate(gens):
        old = g.b.run_id
        want_quiet = i in quiet
        if (partition_of(old, partitions) == target) == want_quiet:
            continue
        new = old
        while (partition_of(new, partitions) == target) != want_quiet or new == old:
            new = old[:-12] + hex_id(rng, 6)
        mapping[old] = new
    if not mapping:
        return
    for g in gens:
        g.b.run_id = mapping.get(g.b.run_id, g.b.run_id)
        g.run_id = g.b.run_id
        for _, ev in g.b.events:
            ev["runId"] = mapping.get(ev["runId"], ev["runId"])
            parent = ev.get("parent")
            if parent is not None and parent["runId"] in mapping:
                parent["runId"] = mapping[parent["runId"]]  # shared by the child's events
            child = ev["data"].get("childRunId") if isinstance(ev["data"], dict) else None
            if child in mapping:
                ev["data"]["childRunId"] = mapping[child]


def _post_terminal_usage(b: RunBuilder, plan: HostilePlan) -> None:
    currency = next(
        (
            ev["data"]["usage"]["currency"]
            for _, ev in b.events
            if ev["type"] == "usage_recorded" and "currency" in ev["data"]["usage"]
        ),
        "USD",
    )
    turn = 1 + max((int(ev["data"].get("turn") or 0) for _, ev in b.events), default=0)
    b.now = max(b.now, b.events[-1][0])
    b.advance(100, 5_000)
    usage = {"inputTokens": 2_400, "outputTokens": 310, "totalTokens": 2_710}
    ev = b.emit(
        "usage_recorded",
        {
            "scope": "provider_turn",
            "turn": turn,
            "attempt": 1,
            "entryId": "ule_late",
            "usage": {**usage, "cost": "0.031000", "currency": currency},
        },
    )
    plan.early.add(ev["eventId"])
    plan.notes[ev["eventId"]] = "reorder_terminal"


def _late_tenant(rng: random.Random, b: RunBuilder, plan: HostilePlan) -> None:
    k = rng.randint(1, min(3, len(b.events) - 2))
    for _, ev in b.events[:k]:
        for name in _OWNERSHIP:
            ev.pop(name, None)
        plan.notes[ev["eventId"]] = "late_tenant"


def _clock_skew(rng: random.Random, b: RunBuilder, plan: HostilePlan) -> None:
    first = rng.randrange(len(b.events))
    origin = b.events[0][0]
    for ms, ev in b.events[first:]:
        ev["ts"] = format_ts(SKEW_BASE_MS + ms - origin)
        plan.notes[ev["eventId"]] = "clock_skew"


def _collision(rng: random.Random, owner: RunGen, plan: HostilePlan) -> RunBuilder:
    tenant = owner.b.events[0][1]["tenantId"]
    other = rng.choice([t for t in TENANTS if t.tenant_id != tenant])
    intruder_plan = RunPlan(other, rng.choice(MODELS[:3]), AGENTS[4], "success", turns=2)
    start = owner.start_ms + rng.randint(60_000, 600_000)
    intruder = RunGen(rng, intruder_plan, start)
    intruder.generate()
    b = intruder.b
    b.run_id = owner.b.run_id
    for _, ev in b.events:
        ev["runId"] = b.run_id
        plan.notes[ev["eventId"]] = "run_id_collision"
    return b


def _duplicate_usage(rng: random.Random, b: RunBuilder, plan: HostilePlan) -> None:
    i = rng.choice(_reported_usage_indexes(b))
    ms, original = b.events[i]
    data: dict[str, Any] = dict(original["data"])
    if rng.random() < 0.5:
        data["entryId"] = "ule_" + hex_id(rng)  # a new entry for the same turn attempt
    copy = {
        **original,
        "eventId": uuid7(ms + 1, rng.getrandbits(74)),
        "seq": original["seq"] + 1,
        "ts": format_ts(ms + 1) if original["ts"] == format_ts(ms) else original["ts"],
        "data": data,
    }
    for _, ev in b.events[i + 1 :]:
        ev["seq"] += 1
    b.events.insert(i + 1, (ms + 1, copy))
    b.seq += 1
    if b.terminal_index is not None and b.terminal_index > i:
        b.terminal_index += 1
    plan.notes[copy["eventId"]] = "duplicate_usage"


def reorder_early(recs: list[FleetRecord], plan: HostilePlan) -> list[FleetRecord]:
    """Deliver the run's early post-terminal rows just before its terminal; add the notes."""
    out = [_noted(rec, plan) for rec in recs]
    early = [rec for rec in out if rec.event is not None and rec.event["eventId"] in plan.early]
    if not early:
        return out
    rest = [rec for rec in out if not any(rec is e for e in early)]
    at = next(
        (
            n
            for n, rec in enumerate(rest)
            if rec.event is not None and rec.event["type"] in _TERMINALS and not rec.note
        ),
        len(rest),
    )
    return rest[:at] + early + rest[at:]


def _noted(rec: FleetRecord, plan: HostilePlan) -> FleetRecord:
    if rec.event is None or rec.note not in ("", "post_terminal"):
        return rec
    note = plan.notes.get(rec.event["eventId"])
    if note is None:
        return rec
    return FleetRecord(rec.key, rec.value, rec.headers, rec.kind, rec.ts_ms, rec.event, note)
