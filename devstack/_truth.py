"""The demo's ground-truth check: every figure the simulator's manifest knows, against the ledger.

Each ``Check`` names what it compared, how many figures, and every disagreement, so the
demo prints what it verified instead of a bare "matches". Manifest sections this code
does not read are listed as not compared (``unread_sections``), never skipped in silence.

Example::

    checks = compare(client, "prism", fleet.manifest)
    print(render(checks, unread_sections(fleet.manifest)))
    ok = all(c.ok for c in checks)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from ._channel_checks import channel_checks

__all__ = ["Check", "compare", "render", "unread_sections"]

# Manifest sections read here, and those that only describe the fleet (nothing to compare).
_READ = {
    "runs",
    "runs_by_status",
    "tenants",
    "by_model",
    "by_agent_month",
    "estimates",
    "dlq",
    "quarantine",
    "quarantined_events",
    "counts",
    "guardrails",
    "alerts",
    "channels",
}
_DESCRIPTIVE = {"version", "params", "watermark", "injected"}
_TOKENS = (
    "input_tokens",
    "output_tokens",
    "total_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
)
# Manifest run fields compared with the ``runs`` column of the same name, when it has one.
_RUN_FIELDS = (
    "tenant_id", "account_id", "user_id", "provider", "model", "parent_run_id", "status",
    "terminal_type", "stop_reason", "failure_class", "model_turns", "deterministic_turns",
    "cache_hit_rate", "usage_mismatch", "clock_skew", "guardrail_denials",
)  # fmt: skip
_MAX_LISTED = 8

Rows = Callable[[str], list[tuple[Any, ...]]]


@dataclass
class Check:
    """One comparison: its name, how many figures it compared, what disagreed."""

    name: str
    compared: int
    unit: str
    problems: list[str] = field(default_factory=list)
    note: str = ""

    @property
    def ok(self) -> bool:
        return not self.problems


def _diff(name: str, unit: str, want: dict[Any, Any], got: dict[Any, Any]) -> Check:
    keys = sorted(set(want) | set(got), key=repr)
    problems = [
        f"{k}: ledger {got.get(k, 0)}, manifest {want.get(k, 0)}"
        for k in keys
        if got.get(k, 0) != want.get(k, 0)
    ]
    return Check(name, len(keys), unit, problems)


def _ranges(seqs: Sequence[int]) -> list[tuple[int, int]]:
    """Seqs as inclusive (first, last) ranges, as the ledger stores gaps."""
    out: list[tuple[int, int]] = []
    for seq in sorted(seqs):
        if out and out[-1][1] == seq - 1:
            out[-1] = (out[-1][0], seq)
        else:
            out.append((seq, seq))
    return out


def _run_values(e: dict[str, Any], columns: set[str]) -> dict[str, Any]:
    """The manifest's facts about one run, named as the ledger's ``runs`` columns."""
    out = {k: e[k] for k in _RUN_FIELDS if k in e and k in columns}
    exh = e.get("exhaustion") or {}
    for k in ("limit", "axis", "maximum", "observed"):
        if f"exhaustion_{k}" in columns:
            out[f"exhaustion_{k}"] = exh.get(k)
    missing = e.get("missing_seqs")
    if missing is not None:
        if "missing_ranges" in columns:
            out["missing_ranges"] = _ranges(missing)
        if "missing_count" in columns:
            out["missing_count"] = len(missing)
        if "missing_seqs" in columns:
            out["missing_seqs"] = list(missing)
    return out


def _same(field_name: str, got: Any, want: Any) -> bool:
    if field_name in ("missing_ranges", "missing_seqs"):
        return [tuple(r) if isinstance(r, list | tuple) else r for r in got or []] == [
            tuple(r) if isinstance(r, list | tuple) else r for r in want or []
        ]
    if field_name in ("cache_hit_rate", "exhaustion_maximum", "exhaustion_observed"):
        if got is None or want is None:
            return got is want
        return abs(float(got) - float(want)) <= 1e-6
    return bool(got == want)


def _runs(rows: Rows, db: str, manifest: dict[str, Any]) -> list[Check]:
    expected = manifest["runs"]
    want_status = manifest.get("runs_by_status") or Counter(r["status"] for r in expected.values())
    got_status: dict[Any, Any] = dict(
        rows(f"SELECT status, count() FROM {db}.runs GROUP BY status")
    )
    checks = [_diff("runs by status", "statuses", dict(want_status), got_status)]
    columns = {
        str(r[0])
        for r in rows(f"SELECT name FROM system.columns WHERE database = '{db}' AND table = 'runs'")
    }
    sample: dict[str, Any] = next(iter(expected.values()), {})
    fields = sorted(_run_values(sample, columns)) if sample else []
    ledger = {
        r[0]: dict(zip(fields, r[1:], strict=True))
        for r in rows(f"SELECT run_id{''.join(', ' + f for f in fields)} FROM {db}.runs")
    }
    problems = [
        f"run {run_id}: {'missing from the ledger' if run_id in expected else 'not in the fleet'}"
        for run_id in sorted(set(expected) ^ set(ledger))
    ]
    compared = 0
    for run_id in sorted(set(expected) & set(ledger)):
        for name, want in _run_values(expected[run_id], columns).items():
            compared += 1
            if not _same(name, ledger[run_id].get(name), want):
                problems.append(
                    f"run {run_id}: {name} = {ledger[run_id].get(name)!r}, want {want!r}"
                )
    note = f"{len(fields)} fields: {', '.join(fields)}"
    checks.append(
        Check("run records", compared, f"facts of {len(expected):,} runs", problems, note)
    )
    return checks


def _usage(rows: Rows, db: str, manifest: dict[str, Any]) -> list[Check]:
    want_tokens: dict[Any, int] = {}
    for g in manifest.get("by_model", []):
        if g["billable"]["rows"]:
            key = (g["tenant_id"], g["provider"], g["model"], g["currency"])
            for k in (*_TOKENS, "rows"):
                want_tokens[(*key, k)] = int(g["billable"][k])
    got_tokens: dict[Any, int] = {}
    for r in rows(
        f"SELECT ifNull(tenant_id, ''), ifNull(provider, ''), ifNull(model, ''), currency, "
        f"{', '.join(f'sum(ifNull({k}, 0))' for k in _TOKENS)}, count() "
        f"FROM {db}.billing_usage WHERE NOT estimated GROUP BY 1, 2, 3, 4"
    ):
        for k, v in zip((*_TOKENS, "rows"), r[4:], strict=True):
            got_tokens[(*r[:4], k)] = int(v)
    want_cost = {
        (t, cur): Decimal(amount)
        for t, fig in manifest["tenants"].items()
        for cur, amount in fig["billable"]["cost"].items()
    }
    got_cost = {
        (t, cur): Decimal(str(v))
        for t, cur, v in rows(
            f"SELECT tenant_id, currency, sum(cost) FROM {db}.billing_usage "
            f"WHERE NOT estimated AND cost IS NOT NULL GROUP BY 1, 2"
        )
    }
    want_est = {
        (t, conf): n
        for t, fig in manifest["tenants"].items()
        for conf, n in fig["estimated"]["by_confidence"].items()
        if n
    }
    got_est = {
        (t, conf): int(n)
        for t, conf, n in rows(
            f"SELECT tenant_id, ifNull(confidence, 'low'), sum(ifNull(total_tokens, 0)) "
            f"FROM {db}.billing_usage WHERE estimated AND NOT superseded GROUP BY 1, 2"
        )
        if n
    }
    checks = [
        _diff("billable usage", "token sums and row counts", want_tokens, got_tokens),
        _diff("reported cost", "tenant/currency sums", want_cost, got_cost),
        _diff("estimates by confidence", "tenant/confidence token sums", want_est, got_est),
    ]
    fleet = (manifest.get("estimates") or {}).get("by_confidence")
    if fleet:
        want_fleet = {
            (conf, k): int(v) for conf, figures in fleet.items() for k, v in figures.items() if v
        }
        got_fleet: dict[Any, Any] = {}
        for r in rows(
            f"SELECT ifNull(confidence, 'low'), count(), sum(ifNull(input_tokens, 0)), "
            f"sum(ifNull(output_tokens, 0)), sum(ifNull(total_tokens, 0)) "
            f"FROM {db}.billing_usage WHERE estimated AND NOT superseded GROUP BY 1"
        ):
            names = ("rows", "input_tokens", "output_tokens", "total_tokens")
            for k, v in zip(names, r[1:], strict=True):
                if v:
                    got_fleet[(r[0], k)] = int(v)
        checks.append(
            _diff("estimates, fleet-wide", "confidence/figure sums", want_fleet, got_fleet)
        )
    return checks


def _agent_month(client: Any, db: str, manifest: dict[str, Any]) -> Check:
    """Reported usage per agent, month and currency, as ``billing --group-by agent,month``."""
    from datetime import UTC, datetime

    from prism.sinks import billing_report

    names = ("rows", "input_tokens", "output_tokens", "total_tokens", "cost")
    want = {
        (g["agent_id"], g["month"], g["currency"], k): g[k] if k != "cost" else Decimal(g[k])
        for g in manifest.get("by_agent_month", [])
        for k in names
        if g[k] is not None
    }
    got: dict[Any, Any] = {}
    lo, hi = datetime(1900, 1, 1, tzinfo=UTC), datetime(2299, 12, 31, tzinfo=UTC)
    for line in billing_report(client, db, lo, hi, group_by=("agent", "month")):
        if line.kind == "reported":
            key = (line.agent_id or "", line.month, line.currency)
            for k in names:
                if getattr(line, k) is not None:
                    got[(*key, k)] = got.get((*key, k), 0) + getattr(line, k)
    return _diff("billing by agent, month", "agent/month/currency figures", want, got)


def _quarantined_events(
    rows: Rows, db: str, want_ids: dict[str, str], events: Sequence[dict[str, Any]]
) -> Check:
    """Quarantined events by (run, seq, reason); which event id holds a seq is only noted.

    Of two events claiming one seq the core keeps the first to arrive and the manifest the
    smallest event id, so the same (run, seq) may be quarantined under the other id.
    """
    got_ids: dict[Any, Any] = dict(
        rows(f"SELECT event_id, any(reason) FROM {db}.quarantine GROUP BY event_id")
    )
    if not events:
        return _diff("quarantined events", "event ids and reasons", want_ids, got_ids)
    where = {ev["eventId"]: (ev["runId"], int(ev["seq"])) for ev in events}
    want = Counter((*where[e], reason) for e, reason in want_ids.items() if e in where)
    got = Counter(
        {
            (run, int(seq), reason): int(n)
            for run, seq, reason, n in rows(
                f"SELECT run_id, seq, reason, uniqExact(event_id) FROM {db}.quarantine "
                "GROUP BY 1, 2, 3"
            )
        }
    )
    check = _diff("quarantined events", "run/seq/reason triples", dict(want), dict(got))
    other = sum(1 for e in set(want_ids) ^ set(got_ids))
    if other:
        check.note = f"{other} event ids differ: the same seqs, held by the other claimant"
    return check


def _rejects(
    rows: Rows, db: str, manifest: dict[str, Any], events: Sequence[dict[str, Any]]
) -> list[Check]:
    dlq: dict[Any, Any] = dict(rows(f"SELECT code, count() FROM {db}.dead_letters GROUP BY code"))
    quarantine: dict[Any, Any] = dict(
        rows(f"SELECT reason, uniqExact(event_id) FROM {db}.quarantine GROUP BY reason")
    )
    counts = manifest.get("counts", {})
    checks = [
        _diff("dead letters by reason", "reasons", manifest["dlq"], dlq),
        _diff("quarantine by reason", "reasons", manifest["quarantine"], quarantine),
    ]
    if "applied_events" in counts:
        got = rows(f"SELECT count() FROM {db}.run_events")[0][0]
        checks.append(
            _diff("events applied", "total", {"events": counts["applied_events"]}, {"events": got})
        )
    if "quarantined_events" in manifest:
        checks.append(_quarantined_events(rows, db, manifest["quarantined_events"], events))
    guardrails = manifest.get("guardrails")
    if guardrails:
        want_g = {("rule", k): v for k, v in guardrails.get("by_rule", {}).items()}
        want_g.update({("stage", k): v for k, v in guardrails.get("by_stage", {}).items()})
        want_g[("total", "denials")] = int(guardrails.get("denials", 0))
        got_g: dict[Any, Any] = {("total", "denials"): 0}
        for rule, stage, n in rows(
            f"SELECT JSONExtractString(payload, 'rule'), JSONExtractString(payload, 'stage'), "
            f"count() FROM {db}.run_events WHERE type = 'guardrail_denied' GROUP BY 1, 2"
        ):
            got_g[("rule", rule)] = got_g.get(("rule", rule), 0) + n
            got_g[("stage", stage)] = got_g.get(("stage", stage), 0) + n
            got_g[("total", "denials")] += n
        checks.append(_diff("guardrail denials", "rule/stage counts", want_g, got_g))
    return checks


def _alerts(rows: Rows, db: str, manifest: dict[str, Any]) -> list[Check]:
    """Exhaustion firings by (tenant, axis) and stale-run alerts by run, against the ledger."""
    expected = manifest.get("alerts")
    if not isinstance(expected, dict):
        fired = rows(f"SELECT count() FROM {db}.alerts WHERE state = 'firing'")[0][0]
        note = f"the manifest lists no alerts; the ledger has {fired} firing (not compared)"
        return [Check("alerts", 0, "alerts", note=note)]
    checks = []
    firings = expected.get("run_limit_exhaustion")
    if isinstance(firings, list):
        # the id names tenant, axis and the firing time (rule 16): all three must agree
        want = Counter(a["alert_id"] for a in firings)
        got = Counter(
            alert_id
            for (alert_id,) in rows(
                f"SELECT alert_id FROM {db}.alerts "
                "WHERE rule = 'run_limit_exhaustion' AND state = 'firing'"
            )
        )
        check = _diff("exhaustion alerts", "firings (tenant, axis, time)", dict(want), dict(got))
        check.note = f"{sum(want.values())} expected"
        checks.append(check)
    stale = expected.get("stale_run")
    if isinstance(stale, list):
        # A run judged stale that later reached its terminal has a firing and a resolved row;
        # the manifest lists the runs still incomplete at the end.
        states = rows(
            f"SELECT key, countIf(state = 'resolved') > 0 FROM {db}.alerts "
            "WHERE rule = 'stale_run' GROUP BY key"
        )
        open_now = {key: 1 for key, resolved in states if not resolved}
        check = _diff("stale-run alerts", "runs", dict.fromkeys(stale, 1), open_now)
        resolved = len(states) - len(open_now)
        if resolved:
            check.note = f"{resolved} more fired, then resolved when late events arrived"
        checks.append(check)
    return checks


def compare(
    client: Any,
    database: str,
    manifest: dict[str, Any],
    events: Sequence[dict[str, Any]] = (),
) -> list[Check]:
    """Every check the manifest allows, in the order the demo prints them.

    ``events`` (the fleet's valid envelopes) place quarantined event ids at their run and
    seq; without them quarantined events are compared by id.
    """

    def rows(sql: str) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in client.query(sql).result_rows]

    out = _runs(rows, database, manifest) + _usage(rows, database, manifest)
    out.append(_agent_month(client, database, manifest))
    out += _rejects(rows, database, manifest, events)
    if manifest.get("channels"):
        out += channel_checks(rows, database, manifest["channels"], _diff)
    return out + _alerts(rows, database, manifest)


def unread_sections(manifest: dict[str, Any]) -> list[str]:
    """Manifest sections with facts this check does not compare (shown, not hidden)."""
    return sorted(set(manifest) - _READ - _DESCRIPTIVE)


def render(checks: Sequence[Check], unread: Sequence[str] = ()) -> str:
    """One line per check: result, what was compared, then the first disagreements."""
    lines = []
    for c in checks:
        mark = "ok      " if c.ok and c.compared else "MISMATCH" if not c.ok else "skipped "
        what = f"{c.compared:,} {c.unit}" if c.compared else c.note
        note = f" ({c.note})" if c.compared and c.note else ""
        lines.append(f"  {mark} {c.name:<25} {what}{note}")
        for p in c.problems[:_MAX_LISTED]:
            lines.append(f"           - {p}")
        if len(c.problems) > _MAX_LISTED:
            lines.append(f"           - ... and {len(c.problems) - _MAX_LISTED} more")
    for name in unread:
        lines.append(f"  skipped  manifest section {name!r}: not compared by this demo")
    return "\n".join(lines)
