"""Step 3 of the checkpoint: the alert rows a committed batch raised go to the notifiers.

A notifier (the webhook, a test's list) must never stop the stream: its failure is
logged and the batch stays committed. Receivers deduplicate by alert id.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

from prism.schemas import AlertRow

__all__ = ["AlertSink", "Notifiers"]

log = logging.getLogger("prism.worker")

AlertSink = Callable[[list[AlertRow]], Awaitable[None]]


class Notifiers:
    """The worker's alert sinks, called in order; failures logged, never raised."""

    def __init__(self, sinks: Sequence[AlertSink]) -> None:
        self.sinks = list(sinks)

    async def send(self, rows: list[AlertRow]) -> None:
        for sink in self.sinks:
            try:
                await sink(rows)
            except Exception:  # a notifier must never stop the stream
                log.exception("alert sink %r failed", sink)

    async def aclose(self, timeout: float = 5.0) -> None:
        """Close the sinks that hold a connection (``aclose(timeout=...)``)."""
        for sink in self.sinks:
            aclose = getattr(sink, "aclose", None)
            if aclose is not None:
                try:
                    await aclose(timeout=timeout)
                except Exception:
                    log.exception("closing alert sink %r failed", sink)
