"""Build the ``faust.App`` from settings: broker, security, store, commit and batching knobs."""

from __future__ import annotations

from typing import Any

import faust

from ..settings import Settings

__all__ = ["make_app"]


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
