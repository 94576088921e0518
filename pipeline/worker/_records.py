"""Small translations between Kafka records, settings and the core, for the worker."""

from __future__ import annotations

from typing import Any

import faust

from prism.schemas import ContractViolation

from ..core import CoreConfig, OutRecord
from ..settings import Settings

__all__ = ["core_config", "dlq_record", "header", "lag", "source_range"]


def core_config(settings: Settings) -> CoreConfig:
    return CoreConfig(
        grace_period_s=settings.grace_period_seconds,
        stale_after_s=settings.stale_run_seconds,
        tombstone_retention_s=settings.tombstone_retention_seconds,
        alert_window_s=settings.alert_window_seconds,
        alert_threshold=settings.alert_limit_deaths_threshold,
    )


def lag(app: faust.App, tp: Any, offset: int) -> int:
    """Records behind the partition's high watermark after ``offset``."""
    try:
        return max(0, int(app.consumer.highwater(tp)) - offset - 1)
    except Exception:  # no highwater known yet
        return 0


def header(headers: Any, name: str) -> str | None:
    if not headers:
        return None
    items = headers.items() if isinstance(headers, dict) else headers
    for k, v in items:
        if k == name:
            return v.decode() if isinstance(v, bytes) else str(v)
    return None


def dlq_record(msg: Any, violation: ContractViolation) -> OutRecord:
    return OutRecord(
        key=msg.key or b"",
        value=msg.value or b"",
        headers=(
            ("reason", violation.reason.encode()),
            ("reason-code", violation.code.encode()),
            ("source-topic", msg.topic.encode()),
            ("source-partition", str(msg.partition).encode()),
            ("source-offset", str(msg.offset).encode()),
        ),
    )


def source_range(source: str, partition: int, first: int, last: int) -> Any:
    from prism.sinks import SourceRange

    return SourceRange(source, partition, first, last)
