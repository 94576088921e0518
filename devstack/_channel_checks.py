"""The manifest's ``channels`` section against the ledger's channel views, figure by figure.

Every operation's row (state, connection, tenant, kind, reason, run, transitions, stuck,
first and last time), the open items with their age at the watermark, the stuck
operations, denials by connection and reason, and the quarantined records by event id.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

__all__ = ["channel_checks"]

Rows = Callable[[str], list[tuple[Any, ...]]]
_OP_FIELDS = ("connection_id", "tenant_id", "kind", "state", "reason", "run_id", "transitions",
              "stuck", "first_ts", "last_ts")  # fmt: skip


def _ts(value: datetime) -> str:
    return value.replace(tzinfo=UTC).isoformat(timespec="milliseconds")


def _plain(value: Any) -> Any:
    return _ts(value) if isinstance(value, datetime) else value


def channel_checks(rows: Rows, db: str, truth: dict[str, Any], make_check: Any) -> list[Any]:
    """The channel ``Check``s (``make_check(name, unit, want, got)`` builds one)."""
    ops = {
        r[0]: dict(zip(_OP_FIELDS, (_plain(v) for v in r[1:]), strict=True))
        for r in rows(f"SELECT operation_id, {', '.join(_OP_FIELDS)} FROM {db}.channel_operations")
    }
    want_ops = {(op_id, f): op[f] for op_id, op in truth["operations"].items() for f in _OP_FIELDS}
    got_ops = {(op_id, f): op[f] for op_id, op in ops.items() for f in _OP_FIELDS}
    checks = [make_check("channel operations", "operation fields", want_ops, got_ops)]
    open_fields = ("connection_id", "tenant_id", "state", "since", "age_seconds")
    want_open = {(o["operation_id"], f): o[f] for o in truth["open_items"] for f in open_fields}
    got_open = {
        (r[0], f): _plain(v)
        for r in rows(f"SELECT operation_id, {', '.join(open_fields)} FROM {db}.channel_open_items")
        for f, v in zip(open_fields, r[1:], strict=True)
    }
    checks.append(make_check("channel open items", "item fields", want_open, got_open))
    want_stuck = dict.fromkeys(truth["stuck"], 1)
    stuck_sql = f"SELECT operation_id FROM {db}.channel_operations WHERE stuck"
    got_stuck = {r[0]: 1 for r in rows(stuck_sql)}
    checks.append(make_check("channel stuck operations", "operations", want_stuck, got_stuck))
    want_denials = {
        (conn, reason): n
        for conn, by_reason in truth["denials"]["by_connection"].items()
        for reason, n in by_reason.items()
    }
    got_denials = {
        (conn, reason): n
        for conn, reason, n in rows(
            f"SELECT connection_id, reason, sum(count) FROM {db}.channel_denials GROUP BY 1, 2"
        )
    }
    checks.append(make_check("channel denials", "connection/reason counts", want_denials,
                             got_denials))  # fmt: skip
    q_sql = f"SELECT event_id, any(reason) FROM {db}.channel_quarantine GROUP BY 1"
    got_q: dict[Any, Any] = dict(rows(q_sql))
    checks.append(make_check("channel quarantine", "records", truth["quarantined_events"], got_q))
    return checks
