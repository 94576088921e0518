"""``ReplayEvent``: one event as a replay consumer sees it, from a Kafka record or a ledger row.

Printing goes through ``format_event``: ``jsonl`` writes the envelope as one JSON line (the
record's own JSON for Kafka; the columns the raw log keeps for the ledger), ``pretty``
writes a one-line human summary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import orjson

from prism.schemas import SCHEMA_ID, is_terminal_agent_event_type, parse_event

__all__ = ["FORMATS", "ReplayEvent", "event_from_ledger_row", "event_from_record", "format_event"]

Format = Literal["jsonl", "pretty"]
FORMATS: tuple[str, ...] = ("jsonl", "pretty")

_PRETTY_DATA_CHARS = 120


@dataclass(frozen=True, slots=True)
class ReplayEvent:
    """One valid event of a run and where it was read (Kafka position or ledger row)."""

    run_id: str
    seq: int
    event_id: str
    type: str
    ts: datetime
    tenant_id: str | None
    envelope: dict[str, Any] = field(repr=False, compare=False)
    partition: int | None = None
    offset: int | None = None

    @property
    def is_terminal(self) -> bool:
        return is_terminal_agent_event_type(self.type)


def event_from_record(
    value: bytes,
    *,
    partition: int | None = None,
    offset: int | None = None,
    max_bytes: int | None = None,
) -> ReplayEvent:
    """Parse a record value; raise ``schemas.ContractViolation`` if it breaks the contract."""
    ev = parse_event(value) if max_bytes is None else _parse_bounded(value, max_bytes)
    return ReplayEvent(
        run_id=ev.run_id,
        seq=ev.seq,
        event_id=ev.event_id,
        type=ev.type,
        ts=ev.ts,
        tenant_id=ev.tenant_id,
        envelope=orjson.loads(value),
        partition=partition,
        offset=offset,
    )


def _parse_bounded(value: bytes, max_bytes: int) -> Any:
    from prism.schemas import ContractViolation, parse_batch

    (item,) = parse_batch([value], max_bytes=max_bytes)
    if isinstance(item, ContractViolation):
        raise item
    return item


def event_from_ledger_row(row: dict[str, Any]) -> ReplayEvent:
    """A ``run_events`` row (column name -> value) as an event with a rebuilt envelope."""
    ts = row["ts"]
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=UTC)
    envelope: dict[str, Any] = {
        "schema": SCHEMA_ID,
        "eventId": row["event_id"],
        "runId": row["run_id"],
        "seq": row["seq"],
        "type": row["type"],
        "ts": ts.isoformat(),
    }
    for column, key in (
        ("session_id", "sessionId"),
        ("tenant_id", "tenantId"),
        ("account_id", "accountId"),
        ("user_id", "userId"),
    ):
        if row.get(column) is not None:
            envelope[key] = row[column]
    if row.get("agent_id") is not None:
        envelope["agent"] = {"id": row["agent_id"]}
    if row.get("provider") is not None and row.get("model") is not None:
        envelope["model"] = {"provider": row["provider"], "model": row["model"]}
    if row.get("parent_run_id") is not None:
        envelope["parent"] = {"runId": row["parent_run_id"]}
    if row.get("bundle_digest") is not None:
        envelope["bundleDigest"] = row["bundle_digest"]
    envelope["data"] = orjson.loads(row["payload"]) if row.get("payload") else {}
    return ReplayEvent(
        run_id=row["run_id"],
        seq=int(row["seq"]),
        event_id=row["event_id"],
        type=row["type"],
        ts=ts,
        tenant_id=row.get("tenant_id"),
        envelope=envelope,
        partition=row.get("partition"),
        offset=row.get("offset"),
    )


def format_event(ev: ReplayEvent, fmt: str = "jsonl", *, with_run: bool = False) -> str:
    """One output line (no newline) for ``ev``.

    Example::

        format_event(ev, "pretty")
        # '     3  2026-11-30T10:00:03+00:00  provider_turn_finished  turn=1 attempt=1 ...'
    """
    if fmt == "jsonl":
        return orjson.dumps(ev.envelope).decode()
    if fmt != "pretty":
        raise ValueError(f"unknown output format {fmt!r}; use one of {', '.join(FORMATS)}")
    head = f"{ev.seq:>6}  {ev.ts.isoformat()}  {ev.type:<32}"
    if with_run:
        head = f"{ev.run_id}  {ev.tenant_id or '-':<12}  " + head
    mark = "  [terminal]" if ev.is_terminal else ""
    return f"{head}  {_summary(ev.envelope.get('data'))}".rstrip() + mark


def _summary(data: Any) -> str:
    """``key=value`` pairs of the payload, nested objects flattened one level, truncated."""
    if not isinstance(data, dict):
        return ""
    parts = []
    for key, value in data.items():
        if isinstance(value, dict):
            parts += [
                f"{key}.{k}={_scalar(v)}"
                for k, v in value.items()
                if not isinstance(v, dict | list)
            ]
        else:
            parts.append(f"{key}={_scalar(value)}")
    text = " ".join(parts)
    return text if len(text) <= _PRETTY_DATA_CHARS else text[: _PRETTY_DATA_CHARS - 1] + "\u2026"


def _scalar(value: Any) -> str:
    if isinstance(value, str):
        return value
    return orjson.dumps(value).decode()
