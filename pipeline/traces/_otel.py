"""OpenTelemetry plumbing of the trace mapping: the pinned conventions, ids, attribute values.

``SEMCONV_VERSION`` is the OpenTelemetry semantic conventions release whose GenAI names the
mapping follows (all Development status); ids are SHA-256 of run and event ids, so they are
the same on every export.
"""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, TraceFlags

__all__ = [
    "SCOPE",
    "SEMCONV_SCHEMA_URL",
    "SEMCONV_VERSION",
    "Attrs",
    "attr_value",
    "context",
    "nanos",
    "producer_link",
    "put",
    "snake",
    "span_id_of",
    "trace_id_of",
]

SEMCONV_VERSION = "1.44.0"
SEMCONV_SCHEMA_URL = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"
SCOPE = InstrumentationScope("prism.pipeline.traces", schema_url=SEMCONV_SCHEMA_URL)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SNAKE_RE = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")

Attrs = dict[str, Any]


def _digest(size: int, *parts: str) -> int:
    value = int.from_bytes(hashlib.sha256("\x1f".join(parts).encode()).digest()[:size], "big")
    return value or 1  # an all-zero id is invalid in OTLP


def trace_id_of(root_run_id: str) -> int:
    """The trace id of the delegation tree whose top run is ``root_run_id``."""
    return _digest(16, "prism.trace", root_run_id)


def span_id_of(run_id: str, event_id: str | None = None) -> int:
    """The span id of a run (``event_id`` None) or of one of its events."""
    return _digest(8, "prism.span", run_id, event_id or "")


def nanos(value: datetime) -> int:
    value = value if value.tzinfo else value.replace(tzinfo=UTC)
    return (value - _EPOCH) // timedelta(microseconds=1) * 1000


def snake(name: str) -> str:
    return _SNAKE_RE.sub("_", name).lower()


def attr_value(value: Any) -> Any:
    """An OTel attribute value: scalars as they are, a list of strings, anything else JSON."""
    if isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return list(value)
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def put(attrs: Attrs, key: str, value: Any) -> None:
    if value is not None:
        attrs[key] = value


def context(trace_id: int, span_id: int) -> SpanContext:
    return SpanContext(trace_id, span_id, is_remote=False, trace_flags=TraceFlags(1))


def producer_link(traceparent: str | None, event_id: str) -> list[Link]:
    """A link to the producer's span from a W3C ``traceparent`` (none when malformed)."""
    parts = (traceparent or "").strip().split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return []
    try:
        trace_id, span_id = int(parts[1], 16), int(parts[2], 16)
    except ValueError:
        return []
    if not trace_id or not span_id:
        return []
    ctx = SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(1))
    return [Link(ctx, {"prism.link": "producer", "prism.event.id": event_id})]
