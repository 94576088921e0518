"""``EventPublisher``: agent events to Kafka through an idempotent aiokafka producer."""

from __future__ import annotations

from typing import Any

from prism.schemas import MAX_EVENT_BYTES

from ._base import DEFAULT_TOPIC
from ._buffer import BufferedPublisher, FullPolicy
from ._sink import KafkaSink

__all__ = ["DEFAULT_LINGER_MS", "DEFAULT_MAX_BATCH_SIZE", "EventPublisher"]

# Chosen with bench/bench_publisher.py (real broker, ~600-byte events, 4 partitions; the
# comparison is in its docstring): 64 KiB batches need a quarter of the produce requests
# of 16 KiB at saturation, and a 5 ms linger groups a trickle of events better than none
# for ~5 ms of delivery latency.
DEFAULT_LINGER_MS = 5
DEFAULT_MAX_BATCH_SIZE = 64 * 1024
_REQUEST_HEADROOM = 64 * 1024  # key, headers and batch framing on top of the value
_FIXED = ("acks", "enable_idempotence", "key_serializer", "value_serializer", "loop")


class EventPublisher(BufferedPublisher):
    """Publishes agent events to Kafka without ever blocking or crashing the agent.

    Agent records are keyed by ``runId`` (so a run stays on one partition, in order);
    channel-operation records (``publisher.channel(...)``, ``publisher.deny(...)``) go to
    ``channel_topic`` (default: beside ``topic``, e.g. ``prism.channel-operations``), keyed
    by ``operationId``. Both carry the envelope as orjson bytes plus ``content-type`` and,
    inside a span, ``traceparent`` headers, and go through one idempotent producer with
    ``acks="all"``. ``publish()``
    only appends to a bounded buffer; a background task connects (retrying with backoff
    while the broker is down) and sends. A full buffer drops and counts (``"drop"``) or
    parks the event for up to ``deadline`` seconds (``"wait"``). Delivery failures are
    counted and logged, and raised from ``publish``/``flush``/``close`` only with
    ``raise_errors=True``. Other ``producer_kwargs`` (security, ``client_id``, timeouts)
    go to ``AIOKafkaProducer`` as given. Call it from the event loop's thread (or from
    synchronous code before the loop runs; the buffer is sent once it does).

    Example::

        publisher = EventPublisher(**settings.aiokafka_kwargs(), topic=settings.topics.input)
        run = publisher.run("run-42", tenant_id="acme", agent="support-bot")
        run.emit("agent_started", {})
        ...
        await publisher.close()        # delivers what is buffered
        publisher.stats.delivered
    """

    def __init__(
        self,
        bootstrap_servers: str | list[str] = "127.0.0.1:9092",
        *,
        topic: str = DEFAULT_TOPIC,
        channel_topic: str | None = None,
        max_event_bytes: int = MAX_EVENT_BYTES,
        buffer_size: int = 10_000,
        full_policy: FullPolicy = "drop",
        deadline: float = 1.0,
        linger_ms: int = DEFAULT_LINGER_MS,
        max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
        validate: bool = True,
        raise_errors: bool = False,
        start_backoff: tuple[float, float] = (0.1, 5.0),
        **producer_kwargs: Any,
    ) -> None:
        fixed = sorted(set(_FIXED) & set(producer_kwargs))
        if fixed:
            raise ValueError(
                f"EventPublisher sets {', '.join(fixed)} itself (idempotent, acks='all', "
                "bytes in and out); remove them from the keyword arguments"
            )
        kwargs: dict[str, Any] = {
            "client_id": "prism-runtime",
            "max_request_size": max_event_bytes + _REQUEST_HEADROOM,
            **producer_kwargs,
            "bootstrap_servers": bootstrap_servers,
            "acks": "all",
            "enable_idempotence": True,
            "linger_ms": linger_ms,
            "max_batch_size": max_batch_size,
        }
        super().__init__(
            KafkaSink(topic, kwargs),
            topic=topic,
            channel_topic=channel_topic,
            max_event_bytes=max_event_bytes,
            buffer_size=buffer_size,
            full_policy=full_policy,
            deadline=deadline,
            validate=validate,
            raise_errors=raise_errors,
            start_backoff=start_backoff,
        )
        self.bootstrap_servers = bootstrap_servers

    def __repr__(self) -> str:
        return (
            f"EventPublisher(bootstrap_servers={self.bootstrap_servers!r}, topic={self.topic!r}, "
            f"buffer_size={self.buffer_size}, full_policy={self.full_policy!r})"
        )
