"""Parsing raw record values into events (fast, batch-first) and events back into wire dicts.

The fast path validates bytes with pydantic-core directly (no ``json.loads`` round trip)
against the contract's types, discriminated on the ``type`` key. Only a value that fails
there takes the slow path, which either parses an unknown ``type`` into ``UnknownEvent``
or explains the failure as a ``ContractViolation``. ``parse_any_batch`` also accepts
channel-operation records, dispatching on ``schema``.

Failures are built, never raised, inside the batch loops: a raised exception's traceback
holds the loop's frame (and through it the output list), which made one reference cycle
per bad record for the cyclic garbage collector to find. A ``ContractViolation`` returned
in a batch carries no traceback and no context, only its code and reason.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable
from typing import Annotated, Any, TypeVar

import orjson
from pydantic import ConfigDict, Field, TypeAdapter, ValidationError

from prism.schemas._channel import CHANNEL_SCHEMA_ID, ChannelOperation
from prism.schemas._constants import MAX_EVENT_BYTES
from prism.schemas._errors import ContractViolation, reason_from_validation_error, short_repr
from prism.schemas._events import AgentEvent, EventBase, KnownEvent, UnknownEvent

__all__ = [
    "RawValue",
    "event_to_wire",
    "parse_any_batch",
    "parse_batch",
    "parse_channel_batch",
    "parse_channel_operation",
    "parse_event",
]

RawValue = bytes | bytearray | memoryview | str | None
"""A record value as a Kafka client or a file hands it over (``None``: a tombstone)."""

_T = TypeVar("_T")
_Parsed = AgentEvent | ChannelOperation | ContractViolation

# Keys repeat across events, values (ids, hashes) rarely do: cache only keys (measured faster).
_KNOWN = TypeAdapter(
    Annotated[KnownEvent, Field(discriminator="type")], config=ConfigDict(cache_strings="keys")
)
_validate_known = _KNOWN.validator.validate_json
_validate_unknown = UnknownEvent.__pydantic_validator__.validate_json
_validate_channel = ChannelOperation.__pydantic_validator__.validate_json
_CHANNEL_MARK = CHANNEL_SCHEMA_ID.encode()

# Errors at the top level that mean "the JSON value is not an object".
_NOT_AN_OBJECT = {"model_type", "model_attributes_type", "dict_type", "union_tag_not_found"}


def _as_bytes(raw: RawValue) -> bytes | ContractViolation:
    if raw is None:
        return ContractViolation("unparsable", "record value is null (a tombstone), not an event")
    if isinstance(raw, bytes):
        return raw
    if isinstance(raw, str):
        try:
            return raw.encode("utf-8")
        except UnicodeEncodeError as exc:
            return ContractViolation(
                "unparsable", f"value is not valid UTF-8 text ({exc.reason} at {exc.start})"
            )
    return bytes(raw)


def _precheck(raw: RawValue, max_bytes: int) -> bytes | ContractViolation:
    """The value as bytes, or its violation when it is null, oversized or holds NaN/Infinity."""
    data = _as_bytes(raw)
    if isinstance(data, ContractViolation):
        return data
    if len(data) > max_bytes:
        return ContractViolation(
            "oversized",
            f"value is {len(data)} bytes, over the {max_bytes} byte limit; "
            "events must stay under the topic's max value size",
        )
    return _non_json_number(data) or data


def _unparsable(raw: bytes, exc: ValidationError) -> ContractViolation | None:
    """The violation when ``raw`` is not UTF-8, not JSON or not an object; else ``None``."""
    error = exc.errors(include_url=False)[0]
    if error["type"] == "json_invalid":
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as dec:
            return ContractViolation(
                "unparsable", f"value is not UTF-8 ({dec.reason} at byte {dec.start})"
            )
        detail = error.get("ctx", {}).get("error", error["msg"])
        return ContractViolation(
            "unparsable", f"value is not JSON ({detail}): {short_repr(raw[:200])}"
        )
    value = error.get("input")
    if error["loc"] == () and error["type"] in _NOT_AN_OBJECT and not isinstance(value, dict):
        kind = type(value).__name__ if value is not None else "null"
        return ContractViolation(
            "unparsable", f"value is a JSON {kind}, not an object: {short_repr(value)}"
        )
    return None


def _non_json_number(raw: bytes) -> ContractViolation | None:
    """``NaN``/``Infinity`` are not JSON, though the fast parser accepts them as numbers."""
    if b"NaN" not in raw and b"Infinity" not in raw:
        return None
    try:
        orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return ContractViolation(
            "unparsable", f"value is not JSON ({exc}; NaN and Infinity are not JSON numbers)"
        )
    return None  # the words only occur inside strings


def _explain(raw: bytes, exc: ValidationError) -> EventBase | ContractViolation:
    """A value the fast path refused: an unknown type's event, or the violation (not raised)."""
    unparsable = _unparsable(raw, exc)
    if unparsable is not None:
        return unparsable
    kinds = {e["type"] for e in exc.errors(include_url=False)}
    if kinds & {"union_tag_invalid", "union_tag_not_found"}:
        try:
            return _validate_unknown(raw)  # type: ignore[no-any-return]
        except ValidationError as unknown_exc:
            reason = reason_from_validation_error(unknown_exc)
        return ContractViolation("contract_violation", reason)
    return ContractViolation(
        "contract_violation", reason_from_validation_error(exc, strip_tag=True)
    )


def _explain_channel(raw: bytes, exc: ValidationError, fallback: bool) -> ContractViolation | None:
    """The violation of a refused channel record; with ``fallback``, ``None`` when its
    ``schema`` is another family's (the caller then parses it as an agent event)."""
    unparsable = _unparsable(raw, exc)
    if unparsable is not None:
        return unparsable
    if fallback and any(e["loc"] == ("schema",) for e in exc.errors(include_url=False)):
        return None
    return ContractViolation("contract_violation", reason_from_validation_error(exc))


def _agent_one(data: bytes) -> AgentEvent | ContractViolation:
    try:
        return _validate_known(data)  # type: ignore[no-any-return]
    except ValidationError as exc:
        result = _explain(data, exc)
    return result  # type: ignore[return-value]


def _channel_one(data: bytes, fallback: bool) -> ChannelOperation | ContractViolation | None:
    """The record as a channel operation, its violation, or (``fallback``) ``None`` when its
    ``schema`` is not the channel family's."""
    try:
        return _validate_channel(data)  # type: ignore[no-any-return]
    except ValidationError as exc:
        result = _explain_channel(data, exc, fallback)
    return result


def _parse_one(raw: RawValue, max_bytes: int) -> AgentEvent | ContractViolation:
    data = _precheck(raw, max_bytes)
    return data if isinstance(data, ContractViolation) else _agent_one(data)


def _parse_channel_one(raw: RawValue, max_bytes: int) -> ChannelOperation | ContractViolation:
    data = _precheck(raw, max_bytes)
    if isinstance(data, ContractViolation):
        return data
    return _channel_one(data, fallback=False)  # type: ignore[return-value]


def _parse_any_one(raw: RawValue, max_bytes: int) -> _Parsed:
    data = _precheck(raw, max_bytes)
    if isinstance(data, ContractViolation):
        return data
    if _CHANNEL_MARK in data:
        channel = _channel_one(data, fallback=True)
        if channel is not None:
            return channel
    return _agent_one(data)


def parse_event(raw: RawValue, *, max_bytes: int = MAX_EVENT_BYTES) -> AgentEvent:
    """Parse one record value into its event class; raise ``ContractViolation`` if invalid.

    >>> ev = parse_event(b'{"schema": "prism.agent-event/v1", "eventId": "e1", "runId": "r1",'
    ...                  b' "seq": 0, "type": "agent_started", "ts": "2025-01-31T12:00:00Z",'
    ...                  b' "data": {}}')
    >>> type(ev).__name__, ev.run_id
    ('AgentStarted', 'r1')
    """
    result = _parse_one(raw, max_bytes)
    if isinstance(result, ContractViolation):
        raise result
    return result


def parse_channel_operation(raw: RawValue, *, max_bytes: int = MAX_EVENT_BYTES) -> ChannelOperation:
    """Parse one ``prism.channel-operation/v1`` record value; raise ``ContractViolation``.

    >>> op = parse_channel_operation(
    ...     b'{"schema": "prism.channel-operation/v1", "eventId": "e1", "operationId": "op1",'
    ...     b' "seq": 0, "ts": "2026-11-30T12:00:00Z", "connectionId": "telegram:main",'
    ...     b' "kind": "message", "state": "admitted"}')
    >>> op.state, op.key
    ('admitted', 'op1')
    """
    result = _parse_channel_one(raw, max_bytes)
    if isinstance(result, ContractViolation):
        raise result
    return result


def _batch(
    values: Iterable[RawValue], one: Callable[[RawValue, int], _T], max_bytes: int
) -> list[_T]:
    out: list[_T] = []
    append = out.append
    # Parsing builds many small acyclic objects; the cyclic GC's generation-0 passes over
    # them roughly halve throughput (bench/bench_parse.py), so it pauses for the batch.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for raw in values:
            append(one(raw, max_bytes))
    finally:
        if gc_was_enabled:
            gc.enable()
    return out


def parse_batch(
    values: Iterable[RawValue], max_bytes: int = MAX_EVENT_BYTES
) -> list[AgentEvent | ContractViolation]:
    """Parse many record values; each result is an event or the ``ContractViolation`` for it.

    Results keep the order of ``values``; a bad value never affects its neighbours. The
    cyclic garbage collector is paused while the batch parses, so pass bounded batches
    (a poll's worth of records), not an endless iterator.

    >>> [type(r).__name__ for r in parse_batch([b"{", b"[]"])]
    ['ContractViolation', 'ContractViolation']
    """
    out: list[AgentEvent | ContractViolation] = []
    append = out.append
    validate = _validate_known
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for raw in values:
            if (
                type(raw) is bytes
                and len(raw) <= max_bytes
                and b"NaN" not in raw
                and b"Infinity" not in raw
            ):
                try:
                    append(validate(raw))
                    continue
                except ValidationError as exc:
                    result = _explain(raw, exc)
                append(result)  # type: ignore[arg-type]
            else:
                append(_parse_one(raw, max_bytes))
    finally:
        if gc_was_enabled:
            gc.enable()
    return out


def parse_channel_batch(
    values: Iterable[RawValue], max_bytes: int = MAX_EVENT_BYTES
) -> list[ChannelOperation | ContractViolation]:
    """Parse many channel-operation record values (like ``parse_batch``, for that family).

    >>> [type(r).__name__ for r in parse_channel_batch([b"{}"])]
    ['ContractViolation']
    """
    return _batch(values, _parse_channel_one, max_bytes)


def parse_any_batch(values: Iterable[RawValue], max_bytes: int = MAX_EVENT_BYTES) -> list[_Parsed]:
    """Parse values of either family, dispatching on ``schema`` (agent event or channel operation).

    A value whose ``schema`` is ``prism.channel-operation/v1`` becomes a ``ChannelOperation``
    (or its violation); every other value is parsed exactly as ``parse_batch`` parses it.

    >>> [type(r).__name__ for r in parse_any_batch([b'{"schema": "prism.channel-operation/v1"}'])]
    ['ContractViolation']
    """
    return _batch(values, _parse_any_one, max_bytes)


def event_to_wire(ev: EventBase | ChannelOperation) -> dict[str, Any]:
    """The wire form of an event or channel operation: camelCase keys, absent fields omitted.

    ``parse_event(orjson.dumps(event_to_wire(ev))) == ev`` for every parsed event.
    """
    return ev.model_dump(mode="json", by_alias=True, exclude_none=True)
