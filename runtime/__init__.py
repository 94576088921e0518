"""What an agent runtime imports to report its runs: publishers and the per-run emitter.

``EventPublisher`` sends contract events (schemas/CONTRACT.md) to Kafka without ever
blocking or crashing the agent; ``InMemoryPublisher`` has the same interface for a
runtime's own tests; ``RunEmitter`` (from ``publisher.run(...)``) fills ``seq``,
``eventId`` and ``ts`` of a run's events, ``ChannelEmitter`` (from
``publisher.channel(...)``) those of a messaging-channel operation's transitions, which go
to ``prism.channel-operations``. The fleet simulator lives in ``runtime.simulator``.

Example::

    from prism.runtime import EventPublisher

    publisher = EventPublisher("127.0.0.1:9092")
    run = publisher.run("run-42", tenant_id="acme", agent="support-bot",
                        model={"provider": "anthropic", "model": "claude-sonnet-4"})
    run.emit("agent_started", {})
    run.emit("agent_finished", {"finishReason": "stop"})
    op = publisher.channel("telegram:support", "op-81", kind="message", tenant_id="acme")
    op.emit("admitted")
    await publisher.close()
"""

from ._base import DEFAULT_CHANNEL_TOPIC, DEFAULT_TOPIC, PublishResult, Record, channel_topic_for
from ._budget_guard import DEFAULT_BUDGET_TOPIC, BudgetGuard, Decision
from ._buffer import FullPolicy
from ._channel import ChannelEmitter
from ._emitter import RunEmitter
from ._errors import DeliveryFailed, EventTooLarge, InvalidEvent, PublisherClosed, PublisherError
from ._ids import new_event_id, utc_now_rfc3339
from ._memory import InMemoryPublisher
from ._publisher import DEFAULT_LINGER_MS, DEFAULT_MAX_BATCH_SIZE, EventPublisher
from ._spool import FsyncPolicy, SpoolError
from ._stats import PublisherStats

__all__ = [
    "DEFAULT_BUDGET_TOPIC",
    "DEFAULT_CHANNEL_TOPIC",
    "DEFAULT_LINGER_MS",
    "DEFAULT_MAX_BATCH_SIZE",
    "DEFAULT_TOPIC",
    "BudgetGuard",
    "ChannelEmitter",
    "Decision",
    "DeliveryFailed",
    "EventPublisher",
    "EventTooLarge",
    "FsyncPolicy",
    "FullPolicy",
    "InMemoryPublisher",
    "InvalidEvent",
    "PublishResult",
    "PublisherClosed",
    "PublisherError",
    "PublisherStats",
    "Record",
    "RunEmitter",
    "SpoolError",
    "channel_topic_for",
    "new_event_id",
    "utc_now_rfc3339",
]
