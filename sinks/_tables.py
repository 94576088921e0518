"""Which storage table stores which ``LedgerBatch`` list, and its columns (the row's fields)."""

from __future__ import annotations

import dataclasses
from typing import Any

from prism.schemas import (
    AlertRow,
    ChannelDenialRow,
    ChannelOperationRow,
    ChannelQuarantineRow,
    ChannelWatermarkRow,
    DeadLetterRow,
    ProgressRow,
    QuarantineRow,
    RawEventRow,
    RunRow,
    TurnRow,
    UsageRow,
)

__all__ = ["STORAGE_TABLES", "VIEWS", "columns_of"]

# LedgerBatch attribute -> (storage table, row class), in insert order (on a server one after
# another; a chDB ledger inserts several at once, LedgerWriter's ``parallel``).
STORAGE_TABLES: dict[str, tuple[str, type[Any]]] = {
    "events": ("run_events_store", RawEventRow),
    "usage": ("usage_store", UsageRow),
    "turns": ("turns_store", TurnRow),
    "runs": ("runs_store", RunRow),
    "quarantine": ("quarantine_store", QuarantineRow),
    "dead_letters": ("dead_letters_store", DeadLetterRow),
    "alerts": ("alerts_store", AlertRow),
    "channel_operations": ("channel_operations_store", ChannelOperationRow),
    "channel_denials": ("channel_denials_store", ChannelDenialRow),
    "channel_quarantine": ("channel_quarantine_store", ChannelQuarantineRow),
    "channel_watermarks": ("channel_watermark_store", ChannelWatermarkRow),
    "progress": ("worker_progress_store", ProgressRow),
}

# The names users query (views over the storage tables).
VIEWS: tuple[str, ...] = (
    "runs",
    "usage",
    "turns",
    "run_events",
    "cache_hits_1m",
    "quarantine",
    "dead_letters",
    "alerts",
    "billing_usage",
    "channel_operations",
    "channel_open_items",
    "channel_denials",
    "channel_quarantine",
    "guardrail_denials",
    "worker_progress",
)


def columns_of(row_type: type[Any]) -> tuple[str, ...]:
    """The column names of a ledger row class: its field names, in order."""
    return tuple(f.name for f in dataclasses.fields(row_type))
