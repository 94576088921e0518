"""Test helpers for code that writes the ledger: row factories and an insert fault injector.

Example::

    hook = FailingInserts(failures=3)                 # the next 3 insert attempts fail
    writer = LedgerWriter(client, db, insert_hook=hook, retries=1, sleep=lambda s: None)
    writer.add(LedgerBatch(usage=[usage_row("e1", "r1")]), SourceRange("t", 0, 0, 0))
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from prism.schemas import (
    AlertRow,
    ChannelDenialRow,
    ChannelOperationRow,
    ChannelQuarantineRow,
    ChannelWatermarkRow,
    DeadLetterRow,
    QuarantineRow,
    RawEventRow,
    RunRow,
    TurnRow,
    UsageRow,
)

__all__ = [
    "FailingInserts",
    "alert_row",
    "channel_rows",
    "dead_letter_row",
    "event_row",
    "quarantine_row",
    "run_row",
    "turn_row",
    "usage_row",
]

# An hour ago, on the minute: recent enough that raw events are inside their retention TTL.
T0 = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(hours=1)


class FailingInserts:
    """An ``insert_hook`` that fails inserts on demand, like a flaky network or a busy server.

    Fails the next ``failures`` attempts, and every attempt while ``failing`` is true. With
    ``after=True`` the insert is performed and then the error raised (the rows are stored
    but the acknowledgement is lost), the case deduplication tokens exist for. ``tables``
    limits failures to those storage tables. ``calls`` lists every attempted table.
    """

    def __init__(
        self,
        failures: int = 0,
        *,
        error: Callable[[], BaseException] | None = None,
        after: bool = False,
        tables: set[str] | None = None,
    ) -> None:
        self.failures = failures
        self.failing = False
        self.after = after
        self.tables = tables
        self.error = error or (lambda: ConnectionError("injected insert failure"))
        self.calls: list[str] = []
        self.failed = 0

    def __call__(self, table: str, insert: Callable[[], object]) -> object:
        self.calls.append(table)
        fail = (self.failing or self.failures > 0) and (self.tables is None or table in self.tables)
        if not fail:
            return insert()
        if self.failures > 0:
            self.failures -= 1
        self.failed += 1
        if self.after:
            insert()
        raise self.error()


def run_row(run_id: str, **overrides: Any) -> RunRow:
    values: dict[str, Any] = dict(
        run_id=run_id, tenant_id="acme", account_id=None, user_id=None, session_id=None,
        agent_id="agent-1", agent_definition_revision=None, provider="anthropic",
        model="claude", parent_run_id=None, delegation_id=None, child_id=None,
        bundle_digest=None, status="succeeded", terminal_type="agent_finished",
        terminal_seq=3, started_at=T0, finished_at=T0, last_event_at=T0,
        stop_reason=None, stop_detail=None, finish_reason="done", error_code=None,
        error_message=None, failure_class=None, abort_reason=None, denied_reason=None,
        model_turns=1, deterministic_turns=0, tool_calls=0, cache_hit_rate=None,
        exhaustion_limit=None, exhaustion_maximum=None, exhaustion_observed=None,
        exhaustion_axis=None, exhaustion_closest=None, missing_ranges=[], missing_count=0,
        usage_mismatch=False, clock_skew=False, event_count=4, max_seq=3, closed=True,
        timeline="{}", version=1,
    )  # fmt: skip
    values.update(overrides)
    return RunRow(**values)


def turn_row(run_id: str, turn: int = 1, **overrides: Any) -> TurnRow:
    values: dict[str, Any] = dict(
        run_id=run_id, kind="model", turn=turn, attempt=1, tenant_id="acme",
        provider="anthropic", model="claude", seq=turn, ts=T0, stop_reason="end_turn",
        latency_ms=120.0, middleware=None, tools_count=2, tools_ids_hash="h",
        input_tokens=100, output_tokens=20, total_tokens=120, cache_read_tokens=None,
        cache_write_tokens=None, cache_hit_rate=None, usage_source="reported",
        usage_confidence=None, input_cap=None, run_input_budget=None, run_input_used=None,
        max_turns=None, version=1,
    )  # fmt: skip
    values.update(overrides)
    return TurnRow(**values)


def usage_row(event_id: str, run_id: str, **overrides: Any) -> UsageRow:
    values: dict[str, Any] = dict(
        event_id=event_id, run_id=run_id, seq=2, tenant_id="acme", account_id=None,
        provider="anthropic", model="claude", scope="provider_turn", turn=1, attempt=1,
        entry_id=None, input_tokens=100, output_tokens=20, total_tokens=120,
        cache_read_tokens=None, cache_write_tokens=None, cost=Decimal("0.0012"),
        currency="USD", estimated=False, confidence=None, recorded_at=T0,
    )  # fmt: skip
    values.update(overrides)
    return UsageRow(**values)


def event_row(event_id: str, run_id: str, seq: int = 0, **overrides: Any) -> RawEventRow:
    values: dict[str, Any] = dict(
        event_id=event_id, run_id=run_id, seq=seq, type="agent_started", ts=T0,
        tenant_id="acme", account_id=None, user_id=None, session_id=None,
        agent_id="agent-1", provider="anthropic", model="claude", parent_run_id=None,
        bundle_digest=None, payload="{}", traceparent=None, source="prism.agent-events",
        partition=0, offset=seq, received_at=T0,
    )  # fmt: skip
    values.update(overrides)
    return RawEventRow(**values)


def quarantine_row(event_id: str, run_id: str, **overrides: Any) -> QuarantineRow:
    values: dict[str, Any] = dict(
        event_id=event_id, run_id=run_id, seq=9, type="tool_call_finished", ts=T0,
        tenant_id="acme", reason="post_terminal", payload="{}",
        source="prism.agent-events", partition=0, offset=9, received_at=T0,
    )  # fmt: skip
    values.update(overrides)
    return QuarantineRow(**values)


def dead_letter_row(offset: int, **overrides: Any) -> DeadLetterRow:
    values: dict[str, Any] = dict(
        source="prism.agent-events", partition=0, offset=offset, code="unparsable",
        reason="not JSON", size=2, sha256=hashlib.sha256(b"\xff{").hexdigest(),
        preview="\\xff{", received_at=T0,
    )  # fmt: skip
    values.update(overrides)
    return DeadLetterRow(**values)


def alert_row(alert_id: str, **overrides: Any) -> AlertRow:
    values: dict[str, Any] = dict(
        alert_id=alert_id, rule="run_limit_exhaustion", state="firing", tenant_id="acme",
        key="maxTurns", value=6.0, threshold=5.0, window_start=T0, window_end=T0, ts=T0,
        message="6 runs died on maxTurns in 5 minutes", version=1,
    )  # fmt: skip
    values.update(overrides)
    return AlertRow(**values)


def channel_rows(operation_id: str, event_id: str, **overrides: Any) -> dict[str, list[Any]]:
    """One row of each channel table, as ``LedgerBatch`` keyword arguments (``overrides``
    apply to every row that has the field, e.g. ``tenant_id``)."""
    op: dict[str, Any] = dict(
        operation_id=operation_id, connection_id="telegram:main", tenant_id="acme",
        kind="message", state="delivery_unknown", reason="send timed out", run_id=None,
        session_id=None, agent_id=None, first_ts=T0, last_ts=T0, since=T0, admitted_at=T0,
        delivered_at=None, stuck=False, transitions=3, version=6,
    )  # fmt: skip
    denial: dict[str, Any] = dict(
        event_id=event_id, operation_id=None, ts=T0, connection_id="telegram:main",
        tenant_id="acme", kind="message", reason="capacity", version=2,
    )  # fmt: skip
    quarantined: dict[str, Any] = dict(
        event_id=event_id + "q", operation_id=operation_id, seq=3, state="executing", ts=T0,
        connection_id="telegram:main", tenant_id="acme", reason="illegal_transition",
        payload="{}", source="prism.channel-operations", partition=0, offset=3,
        received_at=T0, version=8,
    )  # fmt: skip
    for values in (op, denial, quarantined):
        values.update({k: v for k, v in overrides.items() if k in values})
    wm = ChannelWatermarkRow(key="pipeline", watermark=T0, version=1)
    return {
        "channel_operations": [ChannelOperationRow(**op)],
        "channel_denials": [ChannelDenialRow(**denial)],
        "channel_quarantine": [ChannelQuarantineRow(**quarantined)],
        "channel_watermarks": [wm],
    }
