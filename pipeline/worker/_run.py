"""Start the worker: migrate the ledger, build the writer and the worker, run its loop."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from .. import core
from ..settings import Settings
from ._app import PipelineWorker
from ._step import StepThread

__all__ = ["WorkerHooks", "build_worker", "run_worker", "switch_interval"]

log = logging.getLogger("prism.worker")


@dataclass(frozen=True, slots=True)
class WorkerHooks:
    """Seams for tests and tooling, passed explicitly (production passes none).

    ``insert_hook(table, insert)`` wraps every ledger insert; ``wrap_writer(writer)``
    returns the ledger sink the worker uses instead of ``writer``; ``clock`` is the
    worker's processing clock (seconds since the epoch); ``drop_fetched(topic, partition,
    records)`` true makes the worker drop a fetched chunk of a slot topic before stepping
    it (the worker must notice and read the offsets back); ``wrap_step(step_thread)``
    returns the batch step the worker uses instead of its own (the benchmark's
    ``bench._machinery`` puts a step without run semantics there).
    """

    insert_hook: Callable[[str, Callable[[], object]], object] | None = None
    wrap_writer: Callable[[Any], Any] | None = None
    clock: Callable[[], float] = time.time
    drop_fetched: Callable[[str, int, list[Any]], bool] | None = None
    wrap_step: Callable[[StepThread], StepThread] | None = None


def build_worker(settings: Settings, hooks: WorkerHooks | None = None) -> PipelineWorker:
    """The worker of ``settings``: ledger migrated, writer built, hooks installed."""
    from prism import sinks

    from .._store import open_ledger
    from ._telemetry import configure_exporters

    configure_exporters(settings.otel_exporter, settings.otel_endpoint)
    client = open_ledger(settings)
    hooks = hooks or WorkerHooks()
    # The worker flushes once per batch (and per timer tick); no size or age cadence.
    ledger = sinks.LedgerWriter(client, settings.clickhouse_database, insert_hook=hooks.insert_hook)
    writer = hooks.wrap_writer(ledger) if hooks.wrap_writer else ledger
    alert_sinks = []
    if settings.alert_webhook_url:
        from prism.pipeline.alerting import WebhookNotifier

        alert_sinks.append(WebhookNotifier(settings.alert_webhook_url))
    worker = PipelineWorker(
        settings, writer, alert_sinks=alert_sinks, clock=hooks.clock,
        drop_fetched=hooks.drop_fetched,
        prices=lambda: sinks.price_book(client, settings.clickhouse_database),
    )  # fmt: skip
    if hooks.wrap_step is not None:
        worker.step_thread = hooks.wrap_step(worker.step_thread)
    return worker


@contextmanager
def switch_interval(seconds: float) -> Iterator[None]:
    """The interpreter's GIL switch interval set to ``seconds`` inside, restored after
    (``Settings.gil_switch_interval_seconds``: the worker's step thread beside its loop)."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def run_worker(
    settings: Settings, *, loglevel: int = logging.INFO, hooks: WorkerHooks | None = None
) -> int:
    """Run until SIGTERM/SIGINT: the batch in hand is committed or dropped, then the worker
    leaves the group and the others take its slots over."""
    import asyncio
    import signal

    from ..topics import check_partitions, ensure_topics

    logging.getLogger().setLevel(loglevel)
    # The configuration first, before anything is done on the broker: the ledger opened and
    # migrated (DSN, path, credentials), the alert sinks built, the metrics port bound.
    worker = build_worker(settings, hooks)
    server = None
    if settings.metrics_port:
        from ._http import MetricsServer

        server = MetricsServer(worker.telemetry, settings.metrics_host, settings.metrics_port)
        server.start()

    async def main() -> None:
        created = await ensure_topics(settings)
        if created:
            log.info("created topics: %s", ", ".join(created))
        await check_partitions(settings)  # the lanes' state fits the input's count
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.stop)
        await worker.run()

    try:
        log.info(
            "worker starting: topic=%s group=%s ledger=%s gil_switch_interval=%gs core=%s",
            settings.topics.input,
            settings.consumer_group,
            settings.clickhouse_database,
            settings.gil_switch_interval_seconds,
            "compiled" if core.COMPILED else "python",
        )
        with switch_interval(settings.gil_switch_interval_seconds):
            asyncio.run(main())
    finally:
        if server is not None:
            server.stop()
    return 0
