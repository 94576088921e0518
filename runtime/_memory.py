"""``InMemoryPublisher``: the publisher's interface without Kafka, for runtimes' own tests."""

from __future__ import annotations

from typing import Any, Self

import orjson

from prism.schemas import CHANNEL_SCHEMA_ID, MAX_EVENT_BYTES

from ._base import DEFAULT_TOPIC, Publisher, PublishResult, Record
from ._errors import PublisherClosed

__all__ = ["InMemoryPublisher"]


class InMemoryPublisher(Publisher):
    """Keeps every published event in memory, checked exactly as ``EventPublisher`` checks it.

    ``events`` holds the envelopes as a consumer would decode them from the record value
    (agent events and channel-operation records, in publish order), ``records`` the
    records themselves (key, value bytes, headers, topic). Delivery is immediate: after
    ``emit()`` the event is already in ``events``. ``events_of``/``types_of``/``run_ids``
    look at agent events only; ``operations_of``/``states_of``/``denials`` at channel ones.

    Example::

        publisher = InMemoryPublisher()
        run = publisher.run("run-1", tenant_id="acme")
        run.emit("agent_started", {})
        run.emit("agent_finished", {})
        assert [e["type"] for e in publisher.events_of("run-1")] == [
            "agent_started", "agent_finished"]
        op = publisher.channel("telegram:main", "op-1", tenant_id="acme")
        op.emit("admitted")
        assert publisher.states_of("op-1") == ["admitted"]
    """

    def __init__(
        self,
        *,
        topic: str = DEFAULT_TOPIC,
        channel_topic: str | None = None,
        max_event_bytes: int = MAX_EVENT_BYTES,
        validate: bool = True,
    ) -> None:
        super().__init__(
            topic=topic,
            channel_topic=channel_topic,
            max_event_bytes=max_event_bytes,
            validate=validate,
        )
        self.events: list[dict[str, Any]] = []
        self.records: list[Record] = []
        self._closed = False

    def publish(self, event: Any) -> PublishResult:
        """Check ``event`` and store it; raises like ``EventPublisher.publish``."""
        if self._closed:
            raise PublisherClosed(
                "publish() called after close(); create a new InMemoryPublisher per test"
            )
        wire, record = self.prepare(event)
        self.records.append(record)
        self.events.append(orjson.loads(record.value))
        self._counts["published"] += 1
        self._counts["delivered"] += 1
        return PublishResult(wire, True)

    async def start(self) -> None:
        """Nothing to start; present for interface parity."""

    async def flush(self, timeout: float | None = None) -> bool:
        """Everything is delivered at once; always ``True``."""
        return True

    async def close(self, timeout: float | None = None) -> bool:
        """Refuse further events; the collected ones stay readable."""
        self._closed = True
        return True

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- helpers for assertions -----------------------------------------------------------
    @property
    def agent_events(self) -> list[dict[str, Any]]:
        """The agent events, in publish order."""
        return [e for e in self.events if e.get("schema") != CHANNEL_SCHEMA_ID]

    @property
    def channel_events(self) -> list[dict[str, Any]]:
        """The channel-operation records, in publish order."""
        return [e for e in self.events if e.get("schema") == CHANNEL_SCHEMA_ID]

    def events_of(self, run_id: str) -> list[dict[str, Any]]:
        """The events of one run, in publish order."""
        return [e for e in self.agent_events if e.get("runId") == run_id]

    def types_of(self, run_id: str) -> list[str]:
        """The event types of one run, in publish order."""
        return [e["type"] for e in self.events_of(run_id)]

    def run_ids(self) -> list[str]:
        """Every run id seen, in order of first appearance."""
        return list(dict.fromkeys(e["runId"] for e in self.agent_events))

    def operations_of(self, operation_id: str) -> list[dict[str, Any]]:
        """The records of one channel operation, in publish order."""
        return [e for e in self.channel_events if e.get("operationId") == operation_id]

    def states_of(self, operation_id: str) -> list[str]:
        """The states one channel operation went through, in publish order."""
        return [e["state"] for e in self.operations_of(operation_id)]

    def denials(self, connection_id: str | None = None) -> list[dict[str, Any]]:
        """Denied admissions (of one connection, or all), in publish order."""
        return [
            e
            for e in self.channel_events
            if e["state"] == "denied" and connection_id in (None, e["connectionId"])
        ]

    def records_on(self, topic: str) -> list[Record]:
        """The records published to one topic, in publish order."""
        return [r for r in self.records if (r.topic or self.topic) == topic]

    def headers_of(self, event_id: str) -> dict[str, bytes]:
        """The record headers of the event with this ``eventId``."""
        for event, record in zip(self.events, self.records, strict=True):
            if event.get("eventId") == event_id:
                return dict(record.headers)
        raise KeyError(f"no event with eventId {event_id!r} was published")

    def clear(self) -> None:
        """Forget collected events and records (counters keep counting)."""
        self.events.clear()
        self.records.clear()
