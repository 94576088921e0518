"""What ``make demo`` prints: the text report from the ledger, and the exact next commands."""

from __future__ import annotations

import shlex
from datetime import timedelta
from pathlib import Path
from typing import Any

from ._kafka import PORT_VARIABLE, LocalKafka

__all__ = ["next_steps", "text_report"]

EXE = ".venv/bin/prism-pipeline"


def _table(title: str, header: tuple[str, ...], rows: list[tuple[Any, ...]]) -> str:
    cells = [tuple(_fmt(v) for v in r) for r in rows] or [tuple("-" for _ in header)]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(header)]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    body = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join([f"\n{title}", line, "-" * len(line), *body])


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def text_report(client: Any, db: str) -> str:
    """Runs, exhaustion, cache, billing, alerts, rejects, channels and guardrails, as text."""

    def rows(sql: str) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in client.query(sql).result_rows]

    parts = [
        _table(
            "Runs by status",
            ("status", "runs"),
            rows(f"SELECT status, count() FROM {db}.runs GROUP BY status ORDER BY 2 DESC"),
        ),
        _table(
            "Top exhaustion axes (runs that died on a limit)",
            ("limit", "runs", "axis blamed"),
            rows(
                f"SELECT exhaustion_limit, count(), any(exhaustion_axis) FROM {db}.runs "
                f"WHERE exhaustion_limit IS NOT NULL AND status = 'failed' "
                f"GROUP BY exhaustion_limit ORDER BY 2 DESC LIMIT 5"
            ),
        ),
        _table(
            "Prompt-cache hit rate by model (token-weighted)",
            ("provider", "model", "hit rate", "turns reporting", "turns not reporting"),
            rows(
                f"SELECT provider, model, sum(cache_read_tokens) / "
                f"nullIf(sum(input_tokens_reporting_cache), 0), sum(turns_reporting_cache), "
                f"sum(turns_not_reporting_cache) FROM {db}.cache_hits_1m "
                f"GROUP BY provider, model ORDER BY provider, model"
            ),
        ),
        _table(
            "Billable provider_turn tokens by tenant (reported usage only)",
            ("tenant", "input", "output", "cost", "currency"),
            rows(
                f"SELECT tenant_id, sum(input_tokens), sum(output_tokens), "
                f"toString(sum(cost)), currency FROM {db}.billing_usage WHERE NOT estimated "
                f"GROUP BY tenant_id, currency ORDER BY tenant_id, currency"
            ),
        ),
        _table(
            "Estimated (never priced) tokens by tenant and confidence",
            ("tenant", "confidence", "total tokens"),
            rows(
                f"SELECT tenant_id, confidence, sum(total_tokens) FROM {db}.billing_usage "
                f"WHERE estimated AND NOT superseded GROUP BY tenant_id, confidence "
                f"ORDER BY tenant_id, confidence"
            ),
        ),
        _table(
            "Alerts raised",
            ("rule", "state", "alerts"),
            rows(
                f"SELECT rule, state, count() FROM {db}.alerts GROUP BY rule, state "
                f"ORDER BY rule, state"
            ),
        ),
        _table(
            "Rejected input",
            ("where", "reason", "records"),
            rows(
                f"SELECT 'dead letter', code, count() FROM {db}.dead_letters GROUP BY code "
                f"UNION ALL SELECT 'quarantine', reason, count() FROM {db}.quarantine "
                f"GROUP BY reason ORDER BY 1, 2"
            ),
        ),
        _table(
            "Channel operations by state",
            ("state", "operations", "stuck"),
            rows(
                f"SELECT ifNull(state, '(none)'), count(), countIf(stuck) "
                f"FROM {db}.channel_operations GROUP BY state ORDER BY 2 DESC"
            ),
        ),
        _table(
            "Open channel items, oldest first (they wait for a host reconcile)",
            ("operation", "connection", "state", "age (s)"),
            rows(
                f"SELECT operation_id, connection_id, state, age_seconds "
                f"FROM {db}.channel_open_items ORDER BY age_seconds DESC LIMIT 5"
            ),
        ),
        _table(
            "Channel admission denials by reason",
            ("reason", "denials", "connections"),
            rows(
                f"SELECT reason, sum(count), uniqExact(connection_id) FROM {db}.channel_denials "
                f"GROUP BY reason ORDER BY 2 DESC"
            ),
        ),
        _table(
            "Guardrail denials by pack",
            ("pack", "denials", "rules"),
            rows(
                f"SELECT pack, count(), uniqExact(rule) FROM {db}.guardrail_denials "
                f"GROUP BY pack ORDER BY 2 DESC"
            ),
        ),
    ]
    return "\n".join(parts)


def _sample_run(manifest: dict[str, Any]) -> str:
    """A run worth tailing: one that died on a limit, else any finished run."""
    runs = manifest["runs"]
    for run_id, run in sorted(runs.items()):
        if run.get("exhaustion") and run["status"] == "failed":
            return str(run_id)
    return str(next(iter(sorted(runs))))


def _channel_steps(manifest: dict[str, Any], kafka_env: str) -> list[str]:
    """The open items' query and an operation to tail, when the fleet had channel traffic."""
    channels = manifest.get("channels")
    if not channels or not channels.get("open_items"):
        return []
    sql = "SELECT * FROM channel_open_items ORDER BY age_seconds DESC"
    item = channels["open_items"][0]["operation_id"]
    return [
        f"  {EXE} query {shlex.quote(sql)}",
        f"  {kafka_env} {EXE} tail --operation {item} --format pretty --timeout 5",
    ]


def next_steps(
    client: Any, db: str, settings: Any, page: Path, broker: LocalKafka, manifest: dict[str, Any]
) -> str:
    """The commands to run next, exactly, with the dates and names of this demo."""
    low, high = client.query(
        f"SELECT min(recorded_at), max(recorded_at) FROM {db}.usage"
    ).result_rows[0]
    start, end = low.date(), high.date() + timedelta(days=1)
    sql = "SELECT status, count() AS runs FROM runs GROUP BY status ORDER BY runs DESC"
    kafka_env = (
        f"PRISM_KAFKA_BOOTSTRAP_SERVERS={broker.bootstrap} "
        f"PRISM_TOPIC_PREFIX={settings.topic_prefix}"
    )
    lines = [
        "",
        "Next: the demo wrote the default ledger, so these need no flags:",
        f"  {EXE} billing --from {start} --to {end} --format table",
        f"  {EXE} query {shlex.quote(sql)}",
        f"  {EXE} report          # rewrites {page}",
        f"  open file://{page} in a browser (no network needed)",
        f"  {EXE} traces --local phoenix --limit 500   # runs as LLM traces in a local Phoenix",
        "Reading Kafka needs this demo's broker and topics:",
        f"  {kafka_env} {EXE} tail --run {_sample_run(manifest)}",
        *_channel_steps(manifest, kafka_env),
        f"The broker keeps running on {broker.bootstrap} (make kafka-down stops it; "
        f"{PORT_VARIABLE} picks its port).",
    ]
    return "\n".join(lines)
