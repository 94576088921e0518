"""What every publisher shares: turning an event into a checked record, and the emitters.

An event is a wire envelope (a mapping with camelCase keys, schemas/CONTRACT.md) or a model
from ``schemas``: an agent event, or a channel-operation record (``schema`` is
``prism.channel-operation/v1``). ``Publisher.prepare`` serialises it once with orjson,
rejects it when it is over ``max_event_bytes`` (``EventTooLarge``) or breaks the contract
(``InvalidEvent``, checked with the ``schemas`` parser of its family on the very bytes that
will be sent), picks its topic and key (agent events: the agent topic, key ``runId``;
channel operations: the channel topic, key ``operationId`` or, for a denial,
``connectionId``) and attaches the ``content-type`` and trace headers.
"""

from __future__ import annotations

import asyncio
import decimal
from collections.abc import Generator, Mapping
from typing import Any, NamedTuple

import orjson

from prism.schemas import (
    CHANNEL_SCHEMA_ID,
    CHANNEL_TOPIC,
    MAX_EVENT_BYTES,
    ChannelOperation,
    ContractViolation,
    EventBase,
    event_to_wire,
    parse_channel_operation,
    parse_event,
)

from ._channel import ChannelEmitter
from ._emitter import RunEmitter
from ._errors import EventTooLarge, InvalidEvent
from ._stats import PublisherStats
from ._tracing import trace_headers

__all__ = [
    "DEFAULT_CHANNEL_TOPIC",
    "DEFAULT_TOPIC",
    "PublishResult",
    "Publisher",
    "Record",
    "channel_topic_for",
]

DEFAULT_TOPIC = "prism.agent-events"
DEFAULT_CHANNEL_TOPIC = CHANNEL_TOPIC
_AGENT_SUFFIX = ".agent-events"
_CONTENT_TYPE = ("content-type", b"application/json")


def channel_topic_for(topic: str) -> str:
    """The channel-operation topic beside an agent-event topic (same prefix).

    >>> channel_topic_for("acme.agent-events")
    'acme.channel-operations'
    """
    if topic.endswith(_AGENT_SUFFIX):
        return topic[: -len(_AGENT_SUFFIX)] + ".channel-operations"
    return DEFAULT_CHANNEL_TOPIC


class Record(NamedTuple):
    """One Kafka record as produced: key (UTF-8), value (JSON), headers and its topic.

    The key is the ``runId`` of an agent event, the ``operationId`` (or, for a denied
    admission, the ``connectionId``) of a channel operation. ``topic=None`` means the
    publisher's agent-event topic.
    """

    key: bytes
    value: bytes
    headers: tuple[tuple[str, bytes], ...]
    topic: str | None = None


class PublishResult:
    """What ``publish()``/``emit()`` return: the event, and whether the buffer took it.

    Needs no awaiting: ``accepted`` is ``True`` or ``False`` at once, except under the
    ``"wait"`` policy with a full buffer, where it is ``None`` until room appears or the
    deadline passes. ``await result`` gives the final ``bool``.
    """

    __slots__ = ("_accepted", "_future", "event")

    def __init__(
        self,
        event: Mapping[str, Any],
        accepted: bool | None,
        future: asyncio.Future[bool] | None = None,
    ) -> None:
        self.event = event
        self._accepted = accepted
        self._future = future

    @property
    def accepted(self) -> bool | None:
        """``True`` buffered, ``False`` dropped, ``None`` still waiting for room."""
        if self._future is not None and self._future.done():
            return self._future.result()
        return self._accepted

    def __await__(self) -> Generator[Any, None, bool]:
        if self._future is not None:
            return (yield from self._future.__await__())
        return bool(self._accepted)

    def __repr__(self) -> str:
        return f"PublishResult(eventId={self.event.get('eventId')!r}, accepted={self.accepted})"


def _json_default(obj: Any) -> Any:
    if isinstance(obj, decimal.Decimal):
        return str(obj)  # the contract takes cost as a decimal string
    if isinstance(obj, set | frozenset | tuple):
        return list(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


def _to_wire(event: Any) -> Mapping[str, Any]:
    if isinstance(event, Mapping):
        return event
    if isinstance(event, EventBase | ChannelOperation):
        return event_to_wire(event)
    raise TypeError(
        f"cannot publish a {type(event).__name__}: pass the wire envelope as a dict "
        "(camelCase keys, schemas/CONTRACT.md) or a schemas event or channel-operation model"
    )


class Publisher:
    """Shared core of ``EventPublisher`` and ``InMemoryPublisher`` (not used directly)."""

    def __init__(
        self,
        *,
        topic: str = DEFAULT_TOPIC,
        channel_topic: str | None = None,
        max_event_bytes: int = MAX_EVENT_BYTES,
        validate: bool = True,
        raise_errors: bool = False,
    ) -> None:
        if max_event_bytes < 1:
            raise ValueError(f"max_event_bytes must be >= 1, got {max_event_bytes!r}")
        self.topic = topic
        self.channel_topic = channel_topic or channel_topic_for(topic)
        self.max_event_bytes = max_event_bytes
        self.raise_errors = raise_errors
        self._validate = validate
        self._counts: dict[str, int] = dict.fromkeys(PublisherStats.__slots__, 0)

    @property
    def stats(self) -> PublisherStats:
        """A snapshot of the counters (see ``PublisherStats``)."""
        return PublisherStats(**self._counts)

    def run(self, run_id: str, **envelope: Any) -> RunEmitter:
        """A ``RunEmitter`` for one run: it assigns ``seq``, ``eventId`` and ``ts``.

        Keyword arguments are the run's envelope fields (see ``RunEmitter``).
        """
        return RunEmitter(self, run_id, **envelope)

    def channel(
        self, connection_id: str, operation_id: str | None = None, **fields: Any
    ) -> ChannelEmitter:
        """A ``ChannelEmitter`` for one channel operation: it assigns ``seq``, ``eventId``, ``ts``.

        Keyword arguments are the operation's fields (``kind``, ``tenant_id``, ``run_id``,
        ``session_id``, ``agent``, ``first_seq``; see ``ChannelEmitter``).
        """
        return ChannelEmitter(self, connection_id, operation_id, **fields)

    def deny(
        self, connection_id: str, reason: str, *, kind: str = "message", **fields: Any
    ) -> PublishResult:
        """Publish one denied admission (no operation id; keyed by ``connection_id``).

        ``reason`` is bounded: ``capacity``, ``unauthorized``, ``unavailable``,
        ``oversized``, ``malformed``, ``unsupported_media``, ``awaiting_decision``, ...
        """
        emitter = ChannelEmitter(self, connection_id, None, kind=kind, **fields)
        return emitter.emit("denied", reason=reason)

    def publish(self, event: Any) -> PublishResult:
        """Buffer one event for delivery; never blocks (implemented by each publisher)."""
        raise NotImplementedError

    def prepare(self, event: Any) -> tuple[Mapping[str, Any], Record]:
        """Serialise and check ``event``; raise ``EventTooLarge``/``InvalidEvent`` (counted)."""
        wire = _to_wire(event)
        channel = wire.get("schema") == CHANNEL_SCHEMA_ID
        run_id = wire.get("runId")
        key = (wire.get("operationId") or wire.get("connectionId")) if channel else run_id
        try:
            value = orjson.dumps(wire, default=_json_default)
        except TypeError as exc:
            self._counts["rejected_invalid"] += 1
            raise InvalidEvent(
                f"not JSON serialisable: {exc}",
                event_id=wire.get("eventId"),
                run_id=run_id,
                type_=wire.get("type"),
            ) from None
        if len(value) > self.max_event_bytes:
            self._counts["rejected_oversize"] += 1
            raise EventTooLarge(
                event_id=wire.get("eventId"),
                run_id=run_id,
                type_=wire.get("type"),
                size=len(value),
                limit=self.max_event_bytes,
            )
        if not isinstance(key, str) or not key:
            self._counts["rejected_invalid"] += 1
            field = "operationId/connectionId" if channel else "runId"
            raise InvalidEvent(
                f"{field}: {key!r} is not a non-empty string (it is the record key)",
                event_id=wire.get("eventId"),
                run_id=run_id,
                type_=wire.get("state" if channel else "type"),
            )
        if self._validate:
            self._check_contract(wire, value, channel)
        topic = self.channel_topic if channel else self.topic
        return wire, Record(key.encode(), value, (_CONTENT_TYPE, *trace_headers()), topic)

    def _check_contract(self, wire: Mapping[str, Any], value: bytes, channel: bool) -> None:
        try:
            if channel:
                parse_channel_operation(value, max_bytes=self.max_event_bytes)
            else:
                parse_event(value, max_bytes=self.max_event_bytes)
        except ContractViolation as exc:
            self._counts["rejected_invalid"] += 1
            raise InvalidEvent(
                exc.reason,
                event_id=wire.get("eventId"),
                run_id=wire.get("runId"),
                type_=wire.get("state" if channel else "type"),
            ) from None
