"""The ground-truth manifest: what a correct pipeline must conclude from the delivered records.

Computed only from the records and the config, never from pipeline code, so it can judge
the pipeline. It is a function of the SET of records, not of their order.

- DLQ: a value larger than ``max_event_bytes`` is ``oversized``; one that is not UTF-8,
  not JSON or not a JSON object is ``unparsable``; any other invalid envelope is
  ``contract_violation`` (the codes of ``schemas.ContractViolation``).
- Duplicates: a valid record whose ``eventId`` was seen before changes nothing.
- Runs: the rules of ``_truth`` (ownership, one holder per seq, one terminal, one reported
  usage per turn attempt) decide which events are quarantined and which are accepted.
- Event time: the watermark is the latest ``ts`` of any valid record, but never beyond the
  pipeline clock (``processing_clock``, default the last agent record's delivery) plus
  ``max_clock_skew_seconds``. A run without a terminal is ``incomplete`` when its last
  accepted event is older than the watermark minus ``stale_after_seconds``; a run with any
  event stamped beyond clock plus skew is flagged ``clock_skew``.
- Billing and estimates: see ``_billing``; the usage mismatch check runs only when a run
  has both a ``run_total`` and a ``provider_turn`` row.
- Alerts: see ``_expected_alerts``; channel operations: see ``_channel_truth``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from datetime import UTC
from typing import Any

from ._billing import UsageTotals
from ._builder import format_ts
from ._channel_truth import channel_truth
from ._chaos import FleetRecord
from ._config import FleetConfig
from ._expected_alerts import LimitDeath, exhaustion_alerts
from ._truth import QUARANTINE_REASONS, RunTruth, judge_run, ts_ms

__all__ = ["MANIFEST_VERSION", "compute_manifest", "processing_clock_ms"]

MANIFEST_VERSION = 2
_TOKENS = ("inputTokens", "outputTokens", "totalTokens")


def compute_manifest(
    records: Sequence[FleetRecord], config: FleetConfig, injected: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The manifest dict (see the module docstring and ``runtime.simulator`` for its shape).

    ``injected`` (what the generator says it did, e.g. which runs are hostile) is recorded
    as given under ``injected``; no figure is derived from it.
    """
    dlq: Counter[str] = Counter()
    seen: set[str] = set()
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    channel: list[dict[str, Any]] = []
    valid = duplicates = channel_duplicates = 0
    for rec in records:
        if rec.kind != "valid":
            dlq[rec.kind] += 1
            continue
        ev = rec.event
        assert ev is not None
        if ev["eventId"] in seen:
            if rec.family == "channel":
                channel_duplicates += 1
            else:
                valid += 1
                duplicates += 1
            continue
        seen.add(ev["eventId"])
        if rec.family == "channel":
            channel.append(ev)
        else:
            valid += 1
            runs[ev["runId"]].append(ev)

    clock_ms = processing_clock_ms(records, config)
    limit_ms = clock_ms + int(config.max_clock_skew_seconds * 1000)
    # An event stamped beyond the clock plus the skew moves no watermark at all (rule 14).
    watermark = max(
        (t for evs in (*runs.values(), channel) for ev in evs if (t := ts_ms(ev)) <= limit_ms),
        default=None,
    )
    stale_before = (watermark or 0) - int(config.stale_after_seconds * 1000)

    quarantined: dict[str, str] = {}
    usage = UsageTotals()
    run_rows: dict[str, Any] = {}
    deaths: list[LimitDeath] = []
    guardrails: Counter[tuple[str, str]] = Counter()
    applied_events = 0
    for run_id, events in runs.items():
        truth = judge_run(run_id, events)
        quarantined.update(truth.quarantined)
        row = _run_row(truth, stale_before, limit_ms)
        run_rows[run_id] = row
        applied_events += len(truth.accepted)
        usage.add_run(truth.owner, truth.accepted, (truth.first_with("agent") or {}).get("id"))
        for ev in truth.accepted:
            if ev["type"] == "guardrail_denied":
                guardrails[(ev["data"]["rule"], ev["data"]["stage"])] += 1
        death = _limit_death(truth, row)
        if death is not None and death[3] <= limit_ms:
            deaths.append(death)

    reasons = Counter(quarantined.values())
    statuses = Counter(row["status"] for row in run_rows.values())
    return {
        "version": MANIFEST_VERSION,
        "params": _params(config, clock_ms),
        "watermark": format_ts(watermark) if watermark is not None else None,
        "counts": {
            "records": len(records),
            "valid_records": valid,
            "duplicates": duplicates,
            "unique_events": valid - duplicates,
            "applied_events": applied_events,
            "quarantined_events": len(quarantined),
        },
        "runs_by_status": dict(sorted(statuses.items())),
        "runs": run_rows,
        "tenants": usage.tenants(run_rows),
        "by_model": usage.by_model(),
        "by_agent_month": usage.by_agent_month(),
        "estimates": {"by_confidence": usage.by_confidence()},
        "dlq": {k: dlq.get(k, 0) for k in ("unparsable", "contract_violation", "oversized")},
        "quarantine": {k: reasons.get(k, 0) for k in QUARANTINE_REASONS},
        "quarantined_events": dict(sorted(quarantined.items())),
        "guardrails": _guardrails(guardrails),
        "alerts": {
            "run_limit_exhaustion": exhaustion_alerts(
                deaths, int(config.alert_window_seconds * 1000), config.alert_threshold
            ),
            "stale_run": sorted(r for r, row in run_rows.items() if row["status"] == "incomplete"),
        },
        "channels": (
            channel_truth(
                channel,
                channel_duplicates,
                watermark or 0,
                int(config.channel_stuck_seconds * 1000),
            )
            if config.channel_operations
            else None
        ),
        "injected": injected or {},
    }


def processing_clock_ms(records: Sequence[FleetRecord], config: FleetConfig) -> int:
    """The pipeline clock in epoch ms: ``processing_clock``, or the last agent-record delivery."""
    if config.processing_clock is not None:
        return int(config.processing_clock.timestamp() * 1000)
    return max((rec.ts_ms for rec in records if rec.family == "agent"), default=0)


def _params(config: FleetConfig, clock_ms: int) -> dict[str, Any]:
    return {
        "seed": config.seed,
        "runs": config.runs,
        "knobs": config.knobs(),
        "stale_after_seconds": config.stale_after_seconds,
        "max_event_bytes": config.max_event_bytes,
        "start": config.resolved_start.astimezone(UTC).isoformat(),
        "clock": config.clock,
        "processing_clock": format_ts(clock_ms),
        "max_clock_skew_seconds": config.max_clock_skew_seconds,
        "partitions": config.partitions,
        "alert_window_seconds": config.alert_window_seconds,
        "alert_threshold": config.alert_threshold,
        "channel_stuck_seconds": config.channel_stuck_seconds,
    }


def _guardrails(counts: Counter[tuple[str, str]]) -> dict[str, Any]:
    by_rule: Counter[str] = Counter()
    by_pack: Counter[str] = Counter()
    by_stage: Counter[str] = Counter()
    for (rule, stage), n in counts.items():
        by_rule[rule] += n
        by_pack[rule.removeprefix("pack:").split("/", 1)[0]] += n
        by_stage[stage] += n
    return {
        "denials": sum(counts.values()),
        "by_pack": dict(sorted(by_pack.items())),
        "by_rule": dict(sorted(by_rule.items())),
        "by_stage": dict(sorted(by_stage.items())),
    }


def _limit_death(truth: RunTruth, row: dict[str, Any]) -> LimitDeath | None:
    terminal = truth.terminal
    if terminal is None or terminal["type"] != "error" or row["exhaustion"] is None:
        return None
    limit = row["exhaustion"]["limit"]
    if limit is None:
        return None
    return (truth.owner or "", str(limit), truth.run_id, ts_ms(terminal))


def _run_row(truth: RunTruth, stale_before: int, limit_ms: int) -> dict[str, Any]:
    accepted = truth.accepted
    terminal = truth.terminal
    model = truth.first_with("model") or {}
    parent = truth.first_with("parent") or {}
    status, stop_reason, failure_class = _status(truth, stale_before)
    model_turns: set[int] = set()
    det_turns: set[int] = set()
    cache_read = cache_input = 0
    cache_seen = False
    limit: dict[str, Any] | None = None
    exhausted: dict[str, Any] | None = None
    provider_rows: dict[tuple[int, int], dict[str, Any]] = {}
    estimates: dict[tuple[int, int], dict[str, Any]] = {}
    run_total: dict[str, Any] | None = None
    guardrail_denials = 0
    for ev in accepted:
        type_, data = ev["type"], ev["data"]
        if type_ == "provider_turn_finished":
            model_turns.add(int(data["turn"]))
            read, inp = _turn_cache(data)
            if read is not None and inp is not None:
                cache_seen = True
                cache_read += read
                cache_input += inp
        elif type_ == "deterministic_turn_finished":
            det_turns.add(int(data["turn"]))
        elif type_ == "run_limit_exceeded":
            limit = data
        elif type_ == "budget_exhausted":
            exhausted = data
        elif type_ == "guardrail_denied":
            guardrail_denials += 1
        elif type_ == "usage_recorded":
            row = data["usage"]
            if data["scope"] == "run_total":
                run_total = row
            else:
                key = (int(data["turn"]), int(data["attempt"]))
                (estimates if row.get("estimated") is True else provider_rows)[key] = row
    exhaustion = None
    if limit is not None or exhausted is not None:
        exhaustion = {
            "limit": limit["limit"] if limit else None,
            "maximum": limit["maximum"] if limit else None,
            "observed": limit["observed"] if limit else None,
            "axis": exhausted["axis"] if exhausted else None,
        }
    hit_rate = None
    if cache_seen and cache_input > 0:
        hit_rate = round(cache_read / cache_input, 6)
    mismatch = False
    if run_total is not None and (provider_rows or estimates):
        effective = {**estimates, **provider_rows}
        for name in _TOKENS:
            if name in run_total:
                expected = sum(int(row.get(name, 0)) for row in effective.values())
                mismatch = mismatch or int(run_total[name]) != expected
    upper = int(terminal["seq"]) if terminal is not None else max(int(e["seq"]) for e in accepted)
    return {
        "tenant_id": truth.owner,
        "account_id": truth.account_id,
        "user_id": truth.user_id,
        "provider": model.get("provider"),
        "model": model.get("model"),
        "parent_run_id": parent.get("runId"),
        "status": status,
        "terminal_type": terminal["type"] if terminal else None,
        "stop_reason": stop_reason,
        "failure_class": failure_class,
        "model_turns": len(model_turns),
        "deterministic_turns": len(det_turns),
        "cache_hit_rate": hit_rate,
        "exhaustion": exhaustion,
        "missing_seqs": [s for s in range(upper) if s not in truth.held_seqs],
        "usage_mismatch": mismatch,
        "clock_skew": truth.max_event_ms > limit_ms,
        "guardrail_denials": guardrail_denials,
        "quarantined_events": len(truth.quarantined),
        "last_event_at": format_ts(truth.last_accepted_ms),
    }


def _status(truth: RunTruth, stale_before: int) -> tuple[str, str | None, str | None]:
    terminal = truth.terminal
    if terminal is not None:
        data = terminal["data"]
        if terminal["type"] == "agent_finished":
            return "succeeded", data.get("stopReason"), None
        if terminal["type"] == "agent_denied":
            return "denied", None, None
        failure_class = (data.get("error") or {}).get("failureClass")
        return ("aborted" if data.get("aborted") is True else "failed"), None, failure_class
    if truth.last_accepted_ms < stale_before:
        return "incomplete", None, None
    suspended = resumed = -1
    for ev in truth.accepted:
        if ev["type"] == "run_suspended":
            suspended = max(suspended, int(ev["seq"]))
        elif ev["type"] == "run_resumed":
            resumed = max(resumed, int(ev["seq"]))
    return ("suspended" if suspended > resumed else "running"), None, None


def _turn_cache(data: dict[str, Any]) -> tuple[int | None, int | None]:
    cache = data.get("cache") or {}
    usage = data.get("usage") or {}
    read = cache.get("cacheReadTokens", usage.get("cacheReadTokens"))
    inp = usage.get("inputTokens", (data.get("budgets") or {}).get("inputTokens"))
    return read, inp
