"""Parsing raw record values into events (fast, batch-first) and events back into wire dicts.

The fast path validates bytes with pydantic-core directly (no ``json.loads`` round trip)
against the contract's types, discriminated on the ``type`` key. Only a value that fails
there takes the slow path, which either parses an unknown ``type`` into ``UnknownEvent``
or explains the failure as a ``ContractViolation``.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable
from typing import Annotated, Any

import orjson
from pydantic import ConfigDict, Field, TypeAdapter, ValidationError

from prism.schemas._constants import MAX_EVENT_BYTES
from prism.schemas._errors import ContractViolation, reason_from_validation_error, short_repr
from prism.schemas._events import AgentEvent, EventBase, KnownEvent, UnknownEvent

__all__ = ["RawValue", "event_to_wire", "parse_batch", "parse_event"]

RawValue = bytes | bytearray | memoryview | str | None
"""A record value as a Kafka client or a file hands it over (``None``: a tombstone)."""

# Keys repeat across events, values (ids, hashes) rarely do: cache only keys (measured faster).
_KNOWN = TypeAdapter(
    Annotated[KnownEvent, Field(discriminator="type")], config=ConfigDict(cache_strings="keys")
)
_validate_known = _KNOWN.validator.validate_json
_validate_unknown = UnknownEvent.__pydantic_validator__.validate_json

# Errors at the top level that mean "the JSON value is not an object".
_NOT_AN_OBJECT = {"model_type", "model_attributes_type", "dict_type", "union_tag_not_found"}


def _as_bytes(raw: RawValue) -> bytes:
    if raw is None:
        raise ContractViolation("unparsable", "record value is null (a tombstone), not an event")
    if isinstance(raw, bytes):
        return raw
    if isinstance(raw, str):
        try:
            return raw.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ContractViolation(
                "unparsable", f"value is not valid UTF-8 text ({exc.reason} at {exc.start})"
            ) from None
    return bytes(raw)


def _oversized(size: int, max_bytes: int) -> ContractViolation:
    return ContractViolation(
        "oversized",
        f"value is {size} bytes, over the {max_bytes} byte limit; "
        "events must stay under the topic's max value size",
    )


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


def _slow_path(raw: bytes, exc: ValidationError) -> EventBase:
    """Parse a value the fast path refused: an unknown type, or raise the violation."""
    unparsable = _unparsable(raw, exc)
    if unparsable is not None:
        raise unparsable
    kinds = {e["type"] for e in exc.errors(include_url=False)}
    if kinds & {"union_tag_invalid", "union_tag_not_found"}:
        try:
            return _validate_unknown(raw)  # type: ignore[no-any-return]
        except ValidationError as unknown_exc:
            raise ContractViolation(
                "contract_violation", reason_from_validation_error(unknown_exc)
            ) from None
    raise ContractViolation(
        "contract_violation", reason_from_validation_error(exc, strip_tag=True)
    ) from None


def parse_event(raw: RawValue, *, max_bytes: int = MAX_EVENT_BYTES) -> AgentEvent:
    """Parse one record value into its event class; raise ``ContractViolation`` if invalid.

    >>> ev = parse_event(b'{"schema": "prism.agent-event/v1", "eventId": "e1", "runId": "r1",'
    ...                  b' "seq": 0, "type": "agent_started", "ts": "2025-01-31T12:00:00Z",'
    ...                  b' "data": {}}')
    >>> type(ev).__name__, ev.run_id
    ('AgentStarted', 'r1')
    """
    data = _as_bytes(raw)
    if len(data) > max_bytes:
        raise _oversized(len(data), max_bytes)
    not_json = _non_json_number(data)
    if not_json is not None:
        raise not_json
    try:
        return _validate_known(data)  # type: ignore[no-any-return]
    except ValidationError as exc:
        return _slow_path(data, exc)  # type: ignore[return-value]


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
    validate = _validate_known
    out: list[AgentEvent | ContractViolation] = []
    append = out.append
    # Parsing builds many small acyclic objects; the cyclic GC's generation-0 passes over
    # them roughly halve throughput (bench/bench_parse.py), so it pauses for the batch.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        _parse_into(values, max_bytes, validate, append)
    finally:
        if gc_was_enabled:
            gc.enable()
    return out


def _parse_into(
    values: Iterable[RawValue],
    max_bytes: int,
    validate: Callable[[bytes], Any],
    append: Callable[[Any], None],
) -> None:
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
                failure = exc
            try:
                append(_slow_path(raw, failure))  # type: ignore[arg-type]
            except ContractViolation as violation:
                append(violation)
        else:
            try:
                append(parse_event(raw, max_bytes=max_bytes))
            except ContractViolation as violation:
                append(violation)


def event_to_wire(ev: EventBase) -> dict[str, Any]:
    """The wire form of an event: camelCase keys, absent fields omitted, cost as a string.

    ``parse_event(orjson.dumps(event_to_wire(ev))) == ev`` for every parsed event.
    """
    return ev.model_dump(mode="json", by_alias=True, exclude_none=True)
