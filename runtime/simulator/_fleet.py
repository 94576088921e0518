"""``simulate()``: plans, runs, chaos and delivery order of a whole fleet, plus its manifest."""

from __future__ import annotations

import gc
import random
from dataclasses import dataclass, field
from typing import Any

from ._builder import RunBuilder
from ._catalog import AGENTS, MODELS, TENANTS
from ._channels import channel_records
from ._chaos import (
    FLAVOURS,
    FleetRecord,
    RunChaos,
    add_duplicates,
    add_post_terminal,
    deliver,
    eligible_for_replacement,
)
from ._config import FLEET_SPAN, FleetConfig
from ._guardrails import plan_guardrails
from ._hostile import HostilePlan, apply_hostile, reorder_early
from ._manifest import compute_manifest, processing_clock_ms
from ._runs import RunGen
from ._scenarios import RunPlan, burst_plans, draw_plans
from ._truth import ts_ms

__all__ = ["Fleet", "simulate"]

_MINUTE = 60_000
_SPAN_MS = int(FLEET_SPAN.total_seconds() * 1000)


@dataclass(frozen=True, slots=True)
class Fleet:
    """A simulated fleet: the records in delivery order, the valid envelopes, the manifest.

    ``records`` includes chaos records (duplicates, junk, oversized, noise) and, with
    ``channel_operations``, the channel-operation records (``family == "channel"``);
    ``events`` is the envelope of every valid agent record, ``channel_events`` of every
    channel record, in delivery order (duplicates included).
    """

    config: FleetConfig
    records: list[FleetRecord]
    events: list[dict[str, Any]]
    manifest: dict[str, Any]
    channel_events: list[dict[str, Any]] = field(default_factory=list)


def simulate(config: FleetConfig) -> Fleet:
    """Generate a fleet deterministically from ``config.seed``.

    Example::

        fleet = simulate(FleetConfig(runs=500, seed=42, duplicates=0.01))
        fleet.manifest["runs"][fleet.events[0]["runId"]]["status"]
    """
    # Generation allocates millions of small acyclic objects; cyclic GC passes over them
    # would dominate the run time, so the collector pauses for the duration.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _simulate(config)
    finally:
        if was_enabled:
            gc.enable()


def _simulate(config: FleetConfig) -> Fleet:
    rng = random.Random(config.seed)
    start = int(config.resolved_start.timestamp() * 1000)
    plans = draw_plans(rng, config.runs - config.limit_death_burst)
    if config.guardrail_denials:
        plan_guardrails(random.Random(f"{config.seed}:guardrails"), plans, config.guardrail_denials)
    if config.hostile and not any(plan.outcome == "stale" for plan in plans):
        plans.append(RunPlan(TENANTS[0], MODELS[0], AGENTS[4], "stale", turns=2))  # to go quiet
    gens: list[RunGen] = []
    for plan in plans:
        if plan.outcome == "fresh":
            continue
        if plan.outcome == "stale":
            at = start + rng.randint(0, 30 * _MINUTE)
        else:
            at = start + rng.randint(0, _SPAN_MS - 10 * _MINUTE)
        gens.extend(RunGen(rng, plan, at).generate())
    last = max((g.b.events[-1][0] for g in gens), default=start)
    # Runs still in flight end the fleet: every event of theirs lies in its final minutes.
    end = max(start + _SPAN_MS, last + _MINUTE // 2)
    for plan in plans:
        if plan.outcome == "fresh":
            at = end - rng.randint(150_000, 240_000)
            gens.extend(RunGen(rng, plan, at).generate())
    if config.limit_death_burst:
        # The burst: one tenant's runs die on one axis within a few minutes of each other.
        at = start + _SPAN_MS // 2
        for plan in burst_plans(config.limit_death_burst):
            gens.extend(RunGen(rng, plan, at + rng.randint(0, 90_000)).generate())

    hostile = HostilePlan()
    builders = [g.b for g in gens]
    if config.hostile:
        hostile, extra = apply_hostile(random.Random(f"{config.seed}:hostile"), gens, config)
        builders += extra
    chaos = _plan_chaos(rng, builders, config)
    per_run: list[list[FleetRecord]] = []
    for b, c in zip(builders, chaos, strict=True):
        if c.post_terminal or c.conflicting:
            add_post_terminal(b, c.post_terminal, c.conflicting)
        recs = deliver(b, c, config.reorder_window, config.max_event_bytes)
        per_run.append(reorder_early(recs, hostile) if config.hostile else recs)
    if config.duplicates > 0:
        for b, recs in zip(builders, per_run, strict=True):
            add_duplicates(rng, recs, config.duplicates, b.terminal_seq)
        notes = {r.note for recs in per_run for r in recs}
        if not {"duplicate", "re-emission"} <= notes:  # both kinds at least once
            i = rng.choice([i for i, recs in enumerate(per_run) if len(recs) > 1] or [0])
            add_duplicates(rng, per_run[i], 0.0, builders[i].terminal_seq, force=True)
    if config.channel_operations:
        # Channel traffic ends at the agent events' watermark, so it never moves it.
        agent = [rec for recs in per_run for rec in recs]
        limit = processing_clock_ms(agent, config) + int(config.max_clock_skew_seconds * 1000)
        watermark = max(
            t
            for rec in agent
            if rec.kind == "valid" and rec.event and (t := ts_ms(rec.event)) <= limit
        )
        runs_by_tenant: dict[str, list[tuple[str, str]]] = {}
        for g in gens:
            first = g.b.events[0][1]
            if "parent" not in first and "tenantId" in first:
                runs_by_tenant.setdefault(first["tenantId"], []).append(
                    (g.b.run_id, first["agent"]["id"])
                )
        per_run += channel_records(
            random.Random(f"{config.seed}:channels"),
            config.channel_operations,
            runs_by_tenant,
            start,
            watermark,
            int(config.channel_stuck_seconds * 1000),
        )

    records = _merge(per_run)
    events = [
        r.event
        for r in records
        if r.kind == "valid" and r.event is not None and r.family == "agent"
    ]
    channel = [r.event for r in records if r.family == "channel" and r.event is not None]
    injected: dict[str, Any] = {}
    if config.hostile:
        injected["hostile_runs"] = dict(sorted(hostile.kinds.items()))
        injected["quiet_partition"] = hostile.quiet_partition
    if config.limit_death_burst:
        injected["burst_runs"] = sorted(g.b.run_id for g in gens if g.plan.burst)
    manifest = compute_manifest(records, config, injected)
    return Fleet(config, records, events, manifest, channel)


def _plan_chaos(rng: random.Random, builders: list[RunBuilder], cfg: FleetConfig) -> list[RunChaos]:
    """Per-run chaos; every knob above zero happens at least once (each junk flavour and
    both junk modes, replacing and extra, too)."""
    out = [RunChaos() for _ in builders]
    finished = [i for i, b in enumerate(builders) if b.terminal_index is not None]
    replaceable = [i for i, b in enumerate(builders) if eligible_for_replacement(b)]
    generic = [f for f in FLAVOURS if f != "priced_estimate"]
    for i, c in enumerate(out):
        has_terminal = builders[i].terminal_index is not None
        if cfg.malformed and rng.random() < cfg.malformed:
            c.malformed.append((rng.choice(generic), rng.choice(("replace", "extra"))))
        if cfg.oversized and rng.random() < cfg.oversized:
            c.oversized = True
        if has_terminal and cfg.post_terminal and rng.random() < cfg.post_terminal:
            c.post_terminal = rng.randint(1, 2)
        if has_terminal and cfg.conflicting_terminals and rng.random() < cfg.conflicting_terminals:
            c.conflicting = True
    if cfg.malformed:
        with_estimates = [
            i
            for i in replaceable
            if any(
                ev["type"] == "usage_recorded" and ev["data"]["usage"].get("estimated")
                for _, ev in builders[i].events
            )
        ]
        present = {f for c in out for f, _ in c.malformed}
        for n, flavour in enumerate(FLAVOURS):
            pool = with_estimates if flavour == "priced_estimate" else replaceable
            if flavour not in present and pool:
                mode = "replace" if n % 2 == 0 else "extra"
                out[rng.choice(pool)].malformed.append((flavour, mode))
        modes = {mode for c in out for _, mode in c.malformed}
        for mode in ("replace", "extra"):
            if mode not in modes and replaceable:
                out[rng.choice(replaceable)].malformed.append((rng.choice(generic), mode))
    if cfg.oversized and replaceable and not any(c.oversized for c in out):
        out[rng.choice(replaceable)].oversized = True
    if cfg.post_terminal and finished and not any(c.post_terminal for c in out):
        out[rng.choice(finished)].post_terminal = 1
    if cfg.conflicting_terminals and finished and not any(c.conflicting for c in out):
        out[rng.choice(finished)].conflicting = True
    return out


def _merge(per_run: list[list[FleetRecord]]) -> list[FleetRecord]:
    """Interleave runs by event time, keeping each run's own delivery order."""
    keyed: list[tuple[int, int, int, FleetRecord]] = []
    for r, recs in enumerate(per_run):
        clock = 0
        for pos, rec in enumerate(recs):
            clock = max(clock, rec.ts_ms)
            keyed.append((clock, r, pos, rec))
    keyed.sort(key=lambda t: (t[0], t[1], t[2]))
    return [t[3] for t in keyed]
