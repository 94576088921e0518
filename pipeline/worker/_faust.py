"""faust plumbing: the app from settings, raw topics, acks, and what faust tells of rebalances.

Everything here that touches faust internals is named and kept in one place, pinned by
``tests/unit/test_worker_faust_internals.py`` (faust-streaming is pinned in pyproject):

- ``committed_offset`` reads the consumer's record of the partition's committed offset;
- ``acknowledge`` marks offsets processed once the ledger has them, as faust's stream
  does per message: records of the bulk intake (``_bulk``) and offsets the worker read back
  itself. Without it the consumer never commits past them: its commit offset stops at the
  first offset it did not see acknowledged, and the group's lag never drains;
- ``note_inbound`` tells faust's monitor a partition is processed (its slow-stream checks);
- ``rebalance_epoch`` reads the app's rebalance count and whether one is under way.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import faust
from faust.types.tuples import ack_lock

from ..core import InRecord
from ..settings import Settings

__all__ = [
    "acknowledge",
    "committed_offset",
    "die",
    "header",
    "highwater",
    "in_record",
    "lag",
    "make_app",
    "note_inbound",
    "raw_topic",
    "rebalance_epoch",
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


def acknowledge(app: faust.App, tp: Any, first: int, last: int) -> int:
    """Mark offsets ``first..last`` of ``tp`` processed, as faust's ``Consumer.ack`` does
    per message; its committer commits them with its next commit. Returns how many were new.

    Call only once their records are in the ledger.
    """
    consumer: Any = app.consumer
    with ack_lock:
        committed = consumer._committed_offset[tp]
        index = consumer._acked_index[tp]
        start = first if committed is None else max(first, committed)
        new = [o for o in range(start, last + 1) if o not in index]
        index.update(new)
        consumer._acked[tp].extend(new)
        consumer._n_acked += len(new)
    return len(new)


def note_inbound(app: faust.App, tp: Any, end_offset: int | None) -> None:
    """Tell faust's monitor that ``tp`` is being processed (its slow-stream checks read it)."""
    monitor: Any = app.monitor
    monitor.stream_inbound_time[tp] = time.monotonic()
    if end_offset is not None:
        monitor.track_tp_end_offset(tp, end_offset)


def rebalance_epoch(app: faust.App) -> int | None:
    """How many rebalances the app has begun, or None while one is under way.

    A rebalance is under way from the moment the consumer revokes its partitions (faust's
    ``on_rebalance_start``, called before the revoke handlers) until the table recovery of
    the new assignment is complete and the streams resume (``on_rebalance_end``). Inside
    that span the consumer's generation is still the old one for a while (it changes only
    when the join completes), the assignment may already be the new one, and the tables
    hold what the last recovery read, not what the worker wrote since: nothing taken then
    belongs to a settled assignment.
    """
    a: Any = app
    return None if a.rebalancing else int(a.rebalancing_count)


def committed_offset(app: faust.App, tp: Any) -> int | None:
    """The next offset the group has committed for ``tp``, as the consumer last saw it."""
    consumer: Any = app.consumer  # the concrete Consumer; ConsumerT does not declare these
    offset = consumer._committed_offset.get(tp)
    return None if offset is None else int(offset)


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
        producer_max_request_size=settings.max_record_bytes,
        key_serializer="raw",
        value_serializer="raw",
        web_enabled=False,
        table_standby_replicas=0,
        worker_redirect_stdouts=False,
        stream_wait_empty=False,
    )
