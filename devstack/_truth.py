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

__all__ = ["Check", "compare", "render", "unread_sections"]

# Manifest sections read here, and those that only describe the fleet (nothing to compare).
_READ = {"runs", "tenants", "by_model", "dlq", "quarantine", "counts", "alerts"}
_DESCRIPTIVE = {"version", "params", "watermark"}
_TOKENS = (
    "input_tokens",
    "output_tokens",
    "total_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
)
_RUN_FIELDS = (
    "tenant_id", "provider", "model", "parent_run_id", "status", "terminal_type", "stop_reason",
    "failure_class", "model_turns", "deterministic_turns", "exhaustion_limit", "exhaustion_axis",
    "exhaustion_maximum", "exhaustion_observed", "missing_seqs", "usage_mismatch",
    "cache_hit_rate",
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


def _run_values(e: dict[str, Any]) -> dict[str, Any]:
    exh = e.get("exhaustion") or {}
    out = {k: e.get(k) for k in _RUN_FIELDS if k in e}
    for k in ("limit", "axis", "maximum", "observed"):
        out[f"exhaustion_{k}"] = exh.get(k)
    return out


def _same(field_name: str, got: Any, want: Any) -> bool:
    if field_name == "missing_seqs":
        return list(got or []) == list(want or [])
    if field_name in ("cache_hit_rate", "exhaustion_maximum", "exhaustion_observed"):
        if got is None or want is None:
            return got is want
        return abs(float(got) - float(want)) <= 1e-6
    return bool(got == want)


def _runs(rows: Rows, db: str, manifest: dict[str, Any]) -> list[Check]:
    expected = manifest["runs"]
    want_status = Counter(r["status"] for r in expected.values())
    got_status: dict[Any, Any] = dict(
        rows(f"SELECT status, count() FROM {db}.runs GROUP BY status")
    )
    checks = [_diff("runs by status", "statuses", dict(want_status), got_status)]
    columns = ", ".join(_RUN_FIELDS)
    ledger = {r[0]: dict(zip(_RUN_FIELDS, r[1:], strict=True))
              for r in rows(f"SELECT run_id, {columns} FROM {db}.runs")}  # fmt: skip
    problems = [
        f"run {run_id}: {'missing from the ledger' if run_id in expected else 'not in the fleet'}"
        for run_id in sorted(set(expected) ^ set(ledger))
    ]
    compared = 0
    for run_id in sorted(set(expected) & set(ledger)):
        for name, want in _run_values(expected[run_id]).items():
            compared += 1
            if not _same(name, ledger[run_id][name], want):
                problems.append(f"run {run_id}: {name} = {ledger[run_id][name]!r}, want {want!r}")
    checks.append(Check("run records", compared, f"fields of {len(expected):,} runs", problems))
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
    return [
        _diff("billable usage", "token sums and row counts", want_tokens, got_tokens),
        _diff("reported cost", "tenant/currency sums", want_cost, got_cost),
        _diff("estimates by confidence", "tenant/confidence token sums", want_est, got_est),
    ]


def _rejects(rows: Rows, db: str, manifest: dict[str, Any]) -> list[Check]:
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
    return checks


_ALERT_COLUMNS = ("alert_id", "rule", "state", "tenant_id", "key", "window_start", "window_end")


def _alerts(rows: Rows, db: str, manifest: dict[str, Any]) -> list[Check]:
    expected = manifest.get("alerts")
    if expected is None:
        fired = rows(f"SELECT count() FROM {db}.alerts WHERE state = 'firing'")[0][0]
        note = f"the manifest lists no alerts; the ledger has {fired} firing (not compared)"
        return [Check("alerts", 0, "alerts", note=note)]
    items = expected if isinstance(expected, list) else expected.get("expected", [])
    if not items or not all(isinstance(a, dict) for a in items):
        return [Check("alerts", 0, "alerts", note="the manifest's alerts have an unknown shape")]
    keys = [k for k in _ALERT_COLUMNS if all(k in a for a in items)]
    rules = sorted({str(a["rule"]) for a in items if "rule" in a})
    where = f"WHERE rule IN ({', '.join(repr(r) for r in rules)})" if rules else ""
    want = Counter(tuple(str(a[k]) for k in keys) for a in items)
    got = Counter(
        tuple(str(v) for v in r) for r in rows(f"SELECT {', '.join(keys)} FROM {db}.alerts {where}")
    )
    check = _diff("alerts", f"alerts ({', '.join(keys)})", dict(want), dict(got))
    check.note = f"rules {', '.join(rules) or 'all'}"
    return [check]


def compare(client: Any, database: str, manifest: dict[str, Any]) -> list[Check]:
    """Every check the manifest allows, in the order the demo prints them."""

    def rows(sql: str) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in client.query(sql).result_rows]

    out: list[Check] = []
    for part in (_runs, _usage, _rejects, _alerts):
        out += part(rows, database, manifest)
    return out


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
