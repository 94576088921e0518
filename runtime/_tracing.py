"""W3C trace-context record headers taken from the caller's current OpenTelemetry context."""

from __future__ import annotations

from opentelemetry import propagate, trace

__all__ = ["trace_headers"]

_EMPTY: tuple[tuple[str, bytes], ...] = ()


def trace_headers() -> tuple[tuple[str, bytes], ...]:
    """``traceparent`` (and ``tracestate`` when set) for the current span, or nothing.

    Uses the globally configured propagator, so whatever the runtime set up
    (W3C trace context by default) decides the format; returns no headers when the
    current context holds no valid span.
    """
    if not trace.get_current_span().get_span_context().is_valid:
        return _EMPTY
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    traceparent = carrier.get("traceparent")
    if not traceparent:
        return _EMPTY
    tracestate = carrier.get("tracestate")
    if tracestate:
        return (("traceparent", traceparent.encode()), ("tracestate", tracestate.encode()))
    return (("traceparent", traceparent.encode()),)
