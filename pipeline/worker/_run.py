"""Start the worker: migrate the ledger, build the writer and the app, run faust's Worker."""

from __future__ import annotations

import logging

from .. import _faults
from ..settings import Settings
from ._app import PipelineWorker

__all__ = ["build_worker", "run_worker"]

log = logging.getLogger("prism.worker")


def build_worker(settings: Settings) -> PipelineWorker:
    import sinks

    from ._telemetry import configure_exporters

    configure_exporters(settings.otel_exporter, settings.otel_endpoint)
    client = sinks.connect(settings.clickhouse_dsn, settings.clickhouse_database)
    sinks.migrate(
        client,
        settings.clickhouse_database,
        cluster=settings.clickhouse_cluster,
        raw_event_ttl_days=settings.raw_event_ttl_days,
    )
    # Test-only fault injection (PRISM_FAULTS, see pipeline/_faults.py): None, inert, unless set.
    faults = _faults.from_env()
    ledger = sinks.LedgerWriter(
        client,
        settings.clickhouse_database,
        max_rows=max(10 * settings.batch_max_events, 50_000),
        max_seconds=settings.batch_max_seconds,
        insert_hook=faults.insert_hook if faults else None,
    )
    writer = faults.wrap(ledger) if faults else ledger
    alert_sinks = []
    if settings.alert_webhook_url:
        from pipeline.alerting import WebhookNotifier

        alert_sinks.append(WebhookNotifier(settings.alert_webhook_url))
    return PipelineWorker(settings, writer, alert_sinks=alert_sinks)


def run_worker(settings: Settings, *, loglevel: int = logging.INFO) -> int:
    """Run until SIGTERM/SIGINT; faust stops the agents, flushes and commits on the way out."""
    import asyncio

    import faust

    from ..topics import ensure_topics

    # Declare every topic first: a consumer subscribed to a missing topic ignores it for good.
    created = asyncio.run(ensure_topics(settings))
    if created:
        log.info("created topics: %s", ", ".join(created))
    worker = build_worker(settings)
    log.info(
        "worker starting: topic=%s group=%s ledger=%s",
        settings.topics.input,
        settings.consumer_group,
        settings.clickhouse_database,
    )
    faust.Worker(
        worker.app,
        loglevel=logging.getLevelName(loglevel).lower(),
        quiet=True,
        redirect_stdouts=False,
    ).execute_from_commandline()
    return 0
