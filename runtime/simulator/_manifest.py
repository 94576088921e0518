"""The ground-truth manifest: what a correct pipeline must conclude from the delivered records.

Computed only from the records (in delivery order) and the config, with these rules:
"applied" events are valid, first-seen by ``eventId`` and by ``(runId, seq)``, and not
after the run's terminal (the terminal with the lowest seq). Valid events with a higher
seq than the terminal are quarantined: ``conflicting_terminal`` when terminal-typed,
``post_terminal`` otherwise (counted by distinct ``eventId``). DLQ reasons: a value
larger than ``max_event_bytes`` is ``oversized``; one that is not UTF-8, not JSON or not
a JSON object is ``unparsable``; any other invalid envelope is ``contract_violation``
(the codes of ``schemas.ContractViolation``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import UTC
from decimal import Decimal
from typing import Any

from ._builder import format_ts
from ._chaos import FleetRecord
from ._config import FleetConfig

__all__ = ["MANIFEST_VERSION", "compute_manifest"]

MANIFEST_VERSION = 1
TERMINAL_TYPES = frozenset({"agent_finished", "agent_denied", "error"})
_TOKENS = ("inputTokens", "outputTokens", "totalTokens")


class _Run:
    __slots__ = ("accepted", "delivered_seqs", "first")

    def __init__(self, first: dict[str, Any]) -> None:
        self.first = first
        self.accepted: list[tuple[int, dict[str, Any]]] = []
        self.delivered_seqs: set[int] = set()


def compute_manifest(records: Sequence[FleetRecord], config: FleetConfig) -> dict[str, Any]:
    """The manifest dict (see the module docstring and ``runtime.simulator`` for its shape)."""
    dlq: Counter[str] = Counter()
    seen_ids: set[str] = set()
    seen_keys: set[tuple[str, int]] = set()
    runs: dict[str, _Run] = {}
    valid = duplicates = 0
    watermark: int | None = None
    for rec in records:
        if rec.kind != "valid":
            dlq[rec.kind] += 1
            continue
        ev = rec.event
        assert ev is not None
        valid += 1
        watermark = rec.ts_ms if watermark is None else max(watermark, rec.ts_ms)
        run_id, seq = ev["runId"], int(ev["seq"])
        run = runs.get(run_id)
        if run is None:
            run = runs[run_id] = _Run(ev)
        run.delivered_seqs.add(seq)
        if ev["eventId"] in seen_ids or (run_id, seq) in seen_keys:
            duplicates += 1
            continue
        seen_ids.add(ev["eventId"])
        seen_keys.add((run_id, seq))
        run.accepted.append((rec.ts_ms, ev))

    quarantine: Counter[str] = Counter()
    usage = _UsageTotals()
    run_rows: dict[str, Any] = {}
    applied_events = 0
    stale_before = (watermark or 0) - int(config.stale_after_seconds * 1000)
    for run_id, run in runs.items():
        terms = [ev for _, ev in run.accepted if ev["type"] in TERMINAL_TYPES]
        terminal = min(terms, key=lambda ev: int(ev["seq"])) if terms else None
        applied = run.accepted
        if terminal is not None:
            tseq = int(terminal["seq"])
            applied = [(ms, ev) for ms, ev in run.accepted if int(ev["seq"]) <= tseq]
            for _, ev in run.accepted:
                if int(ev["seq"]) > tseq:
                    reason = (
                        "conflicting_terminal" if ev["type"] in TERMINAL_TYPES else "post_terminal"
                    )
                    quarantine[reason] += 1
        run_rows[run_id] = _run_row(run, applied, terminal, stale_before)
        applied_events += len(applied)
        usage.add_run(applied)

    return {
        "version": MANIFEST_VERSION,
        "params": {
            "seed": config.seed,
            "runs": config.runs,
            "knobs": config.knobs(),
            "stale_after_seconds": config.stale_after_seconds,
            "max_event_bytes": config.max_event_bytes,
            "start": config.resolved_start.astimezone(UTC).isoformat(),
            "clock": config.clock,
        },
        "watermark": format_ts(watermark) if watermark is not None else None,
        "counts": {
            "records": len(records),
            "valid_records": valid,
            "duplicates": duplicates,
            "unique_events": valid - duplicates,
            "applied_events": applied_events,
        },
        "runs": run_rows,
        "tenants": usage.tenants(run_rows),
        "by_model": usage.by_model(),
        "dlq": {k: dlq.get(k, 0) for k in ("unparsable", "contract_violation", "oversized")},
        "quarantine": {k: quarantine.get(k, 0) for k in ("post_terminal", "conflicting_terminal")},
    }


def _run_row(
    run: _Run,
    applied: list[tuple[int, dict[str, Any]]],
    terminal: dict[str, Any] | None,
    stale_before: int,
) -> dict[str, Any]:
    first = run.first
    model = first.get("model") or {}
    parent = first.get("parent") or {}
    status, stop_reason, failure_class = _status(applied, terminal, stale_before)
    model_turns: set[int] = set()
    det_turns: set[int] = set()
    cache_read = cache_input = 0
    cache_seen = False
    limit: dict[str, Any] | None = None
    exhausted: dict[str, Any] | None = None
    provider_rows: dict[tuple[int, int], dict[str, Any]] = {}
    estimates: dict[tuple[int, int], dict[str, Any]] = {}
    run_total: dict[str, Any] | None = None
    for _, ev in applied:
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
    if run_total is not None:
        effective = {**estimates, **provider_rows}
        for name in _TOKENS:
            if name in run_total:
                expected = sum(int(row.get(name, 0)) for row in effective.values())
                mismatch = mismatch or int(run_total[name]) != expected
    if terminal is not None:
        upper = int(terminal["seq"])
    else:
        upper = max(int(ev["seq"]) for _, ev in applied)
    return {
        "tenant_id": first.get("tenantId"),
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
        "missing_seqs": [s for s in range(upper) if s not in run.delivered_seqs],
        "usage_mismatch": mismatch,
        "last_event_at": format_ts(max(ms for ms, _ in applied)),
    }


def _status(
    applied: list[tuple[int, dict[str, Any]]], terminal: dict[str, Any] | None, stale_before: int
) -> tuple[str, str | None, str | None]:
    if terminal is not None:
        data = terminal["data"]
        if terminal["type"] == "agent_finished":
            return "succeeded", data.get("stopReason"), None
        if terminal["type"] == "agent_denied":
            return "denied", None, None
        failure_class = (data.get("error") or {}).get("failureClass")
        return ("aborted" if data.get("aborted") is True else "failed"), None, failure_class
    if max(ms for ms, _ in applied) < stale_before:
        return "incomplete", None, None
    suspended = resumed = -1
    for _, ev in applied:
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


class _UsageTotals:
    """Billable (reported provider_turn rows) and estimated (unsuperseded estimates) totals."""

    def __init__(self) -> None:
        self._groups: dict[tuple[str, str, str, str | None], dict[str, Any]] = {}

    def _group(self, ev: dict[str, Any], currency: str | None) -> dict[str, Any]:
        model = ev.get("model") or {}
        key = (
            ev.get("tenantId") or "",
            model.get("provider") or "",
            model.get("model") or "",
            currency,
        )
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = _empty_figures()
        return group

    def add_run(self, applied: list[tuple[int, dict[str, Any]]]) -> None:
        reported: set[tuple[int, int]] = set()
        estimates: list[tuple[tuple[int, int], dict[str, Any]]] = []
        for _, ev in applied:
            data = ev["data"]
            if ev["type"] != "usage_recorded" or data["scope"] != "provider_turn":
                continue
            row = data["usage"]
            key = (int(data["turn"]), int(data["attempt"]))
            if row.get("estimated") is True:
                estimates.append((key, ev))
                continue
            reported.add(key)
            bill = self._group(ev, row.get("currency"))["billable"]
            bill["input_tokens"] += int(row.get("inputTokens", 0))
            bill["output_tokens"] += int(row.get("outputTokens", 0))
            bill["total_tokens"] += int(row.get("totalTokens", 0))
            bill["cache_read_tokens"] += int(row.get("cacheReadTokens", 0))
            bill["cache_write_tokens"] += int(row.get("cacheWriteTokens", 0))
            bill["rows"] += 1
            if row.get("cost") is not None and row.get("currency"):
                cost = bill["cost"]
                cost[row["currency"]] = cost.get(row["currency"], Decimal(0)) + Decimal(
                    str(row["cost"])
                )
        for key, ev in estimates:
            if key in reported:
                continue
            row = ev["data"]["usage"]
            est = self._group(ev, None)["estimated"]
            est["input_tokens"] += int(row.get("inputTokens", 0))
            est["output_tokens"] += int(row.get("outputTokens", 0))
            est["total_tokens"] += int(row.get("totalTokens", 0))
            est["rows"] += 1
            conf = row.get("confidence") or "low"
            est["by_confidence"][conf] = est["by_confidence"].get(conf, 0) + int(
                row.get("totalTokens", 0)
            )

    def by_model(self) -> list[dict[str, Any]]:
        out = []
        for (tenant, provider, model, currency), figures in sorted(
            self._groups.items(), key=lambda kv: (*kv[0][:3], kv[0][3] or "")
        ):
            out.append(
                {
                    "tenant_id": tenant,
                    "provider": provider,
                    "model": model,
                    "currency": currency,
                    **_render(figures),
                }
            )
        return out

    def tenants(self, run_rows: dict[str, Any]) -> dict[str, Any]:
        merged: dict[str, dict[str, Any]] = {
            str(r["tenant_id"]): _empty_figures() for r in run_rows.values() if r["tenant_id"]
        }
        for (tenant, _, _, _), figures in self._groups.items():
            target = merged.setdefault(tenant, _empty_figures())
            for block in ("billable", "estimated"):
                for name, value in figures[block].items():
                    if isinstance(value, dict):
                        for k, v in value.items():
                            target[block][name][k] = target[block][name].get(k, 0) + v
                    else:
                        target[block][name] += value
        return {tenant: _render(merged[tenant]) for tenant in sorted(merged)}


def _empty_figures() -> dict[str, Any]:
    return {
        "billable": {
            "input_tokens": 0,
            "output_tokens": 0,
            "total_tokens": 0,
            "cache_read_tokens": 0,
            "cache_write_tokens": 0,
            "rows": 0,
            "cost": {},
        },
        "estimated": {
            "input_tokens": 0,
            "output_tokens": 0,
            "total_tokens": 0,
            "rows": 0,
            "by_confidence": {"medium": 0, "low": 0},
        },
    }


def _render(figures: dict[str, Any]) -> dict[str, Any]:
    billable = dict(figures["billable"])
    billable["cost"] = {
        cur: format(amount, "f") for cur, amount in sorted(billable["cost"].items())
    }
    estimated = dict(figures["estimated"])
    estimated["by_confidence"] = dict(estimated["by_confidence"])
    return {"billable": billable, "estimated": estimated}
