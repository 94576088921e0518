"""faust plumbing: the app from settings, raw topics and tables, sends, the event context.

Everything here that touches faust internals is named and kept in one place, pinned by
``tests/unit/test_worker_faust_internals.py`` (faust-streaming is pinned in pyproject):

- ``event_context`` sets faust's private ``_current_event`` (table writes take their
  changelog partition from it, and batches lose it);
- ``committed_offset`` reads the consumer's record of the partition's committed offset;
- ``handled_elsewhere`` tells the consumer that offsets it never delivered were processed
  (read back by the worker), with the consumer's own gap bookkeeping. Without it the
  consumer never commits past a range it skipped: its commit offset stops at the first
  offset it did not see acknowledged, and the group's lag never drains.
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from typing import Any

import faust
from faust.streams import _current_event

from ..core import InRecord, OutRecord
from ..settings import Settings

__all__ = [
    "committed_offset",
    "die",
    "event_context",
    "handled_elsewhere",
    "header",
    "highwater",
    "in_record",
    "lag",
    "make_app",
    "raw_table",
    "raw_topic",
    "send",
]

_RAW: dict[str, Any] = {
    "key_type": bytes,
    "value_type": bytes,
    "key_serializer": "raw",
    "value_serializer": "raw",
}


def raw_topic(app: faust.App, name: str, partitions: int, *more: str) -> Any:
    """A topic of raw bytes keys and values (the pipeline does its own encoding); ``more``
    names further topics the same agent consumes (co-partitioned with the first)."""
    return app.topic(name, *more, partitions=partitions, **_RAW)


def raw_table(app: faust.App, name: str, partitions: int) -> Any:
    """A changelogged table of bytes -> bytes (bytes types give the raw changelog codec)."""
    return app.Table(name, partitions=partitions, default=None, key_type=bytes, value_type=bytes)


@contextmanager
def event_context(event: Any) -> Iterator[None]:
    """Make ``event`` faust's current event, so table writes go to its partition."""
    token = _current_event.set(weakref.ref(event))
    try:
        yield
    finally:
        _current_event.reset(token)


def committed_offset(app: faust.App, tp: Any) -> int | None:
    """The next offset the group has committed for ``tp``, as the consumer last saw it."""
    consumer: Any = app.consumer  # the concrete Consumer; ConsumerT does not declare these
    offset = consumer._committed_offset.get(tp)
    return None if offset is None else int(offset)


async def handled_elsewhere(app: faust.App, tp: Any, ranges: list[tuple[int, int]]) -> None:
    """Let the consumer commit past half-open offset ``ranges`` the worker read back itself.

    Call only once the records of ``ranges`` are in the ledger: the consumer may then
    commit through them as soon as a later offset of ``tp`` is acknowledged.
    """
    consumer: Any = app.consumer
    for start, end in ranges:
        await consumer._add_gap(tp, start, end - 1)


def die(what: str, log: logging.Logger) -> None:
    """Stop the process at once, committing nothing: the batch will be delivered again.

    faust would restart a crashed agent and could commit past the batch it was handling;
    exiting instead keeps every offset of the batch uncommitted (exit status 70).
    """
    log.critical("%s; stopping without committing (the batch is delivered again)", what,
                 exc_info=True)  # fmt: skip
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(70)


def header(headers: Any, name: str) -> str | None:
    """A record header's value as text (faust gives a dict or a list of pairs)."""
    if not headers:
        return None
    items = headers.items() if isinstance(headers, dict) else headers
    for k, v in items:
        if k == name:
            return v.decode() if isinstance(v, bytes) else str(v)
    return None


def in_record(msg: Any) -> InRecord:
    """The core's input record of a faust message or an aiokafka ``ConsumerRecord``."""
    return InRecord(
        msg.value,
        msg.topic,
        msg.partition,
        msg.offset,
        msg.key,
        header(msg.headers, "traceparent"),
    )


async def send(
    app: faust.App, topic: str, rec: OutRecord, partition: int | None = None
) -> Awaitable[Any]:
    """Hand ``rec`` to the producer; await the result to know the broker has it."""
    return await app.producer.send(
        topic, rec.key, rec.value, partition, None, list(rec.headers) or None
    )


def highwater(app: faust.App, tp: Any) -> int | None:
    """The partition's end offset as the consumer last fetched it (None: not known yet)."""
    try:
        return int(app.consumer.highwater(tp))
    except Exception:  # no fetch of the partition yet
        return None


def lag(app: faust.App, tp: Any, offset: int) -> int:
    """Records behind the partition's high watermark after ``offset`` (0 when not known)."""
    end = highwater(app, tp)
    return 0 if end is None else max(0, end - offset - 1)


def make_app(settings: Settings, *, app_id: str | None = None) -> faust.App:
    """A faust app for the pipeline; at-least-once (faust's exactly_once is not relied on)."""
    brokers = [f"kafka://{hp.strip()}" for hp in settings.kafka_bootstrap_servers.split(",")]
    credentials: Any = None
    if settings.kafka_security_protocol != "PLAINTEXT":
        kw = settings.aiokafka_kwargs()
        if settings.kafka_security_protocol.startswith("SASL"):
            credentials = faust.SASLCredentials(
                username=kw["sasl_plain_username"],
                password=kw["sasl_plain_password"],
                mechanism=settings.kafka_sasl_mechanism,
                ssl_context=kw.get("ssl_context"),
            )
        else:
            credentials = faust.SSLCredentials(kw["ssl_context"])
    store = "rocksdb://" if settings.state_store == "rocksdb" else "memory://"
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    return faust.App(
        app_id or settings.consumer_group,
        broker=brokers,
        broker_credentials=credentials,
        store=store,
        datadir=str(settings.state_dir),
        topic_partitions=settings.partitions,
        topic_replication_factor=settings.replication_factor,
        processing_guarantee="at_least_once",
        consumer_auto_offset_reset="earliest",
        broker_commit_interval=1.0,
        broker_commit_every=settings.batch_max_events,
        broker_max_poll_records=max(500, settings.batch_max_events),
        stream_buffer_maxsize=max(4096, settings.batch_max_events * 2),
        producer_linger_ms=5,
        producer_max_request_size=max(1_048_576, settings.max_event_bytes * 2),
        key_serializer="raw",
        value_serializer="raw",
        web_enabled=False,
        table_standby_replicas=0,
        worker_redirect_stdouts=False,
        stream_wait_empty=False,
    )
