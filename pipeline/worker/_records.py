"""Kafka records into the core's ``InRecord``, and the worker's way out on a failure."""

from __future__ import annotations

import logging
import os
from typing import Any

from ..core import InRecord

__all__ = ["die", "header", "in_record"]


def die(what: str, log: logging.Logger) -> None:
    """Stop the process at once, committing nothing: the batch will be delivered again
    (exit status 70). Nothing of the batch's transaction is visible: it never committed,
    and the slot's next owner aborts it when it fences this process's producer."""
    log.critical("%s; stopping without committing (the batch is delivered again)", what,
                 exc_info=True)  # fmt: skip
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(70)


def header(headers: Any, name: str) -> str | None:
    """A record header's value as text (a dict or a list of pairs)."""
    if not headers:
        return None
    items = headers.items() if isinstance(headers, dict) else headers
    for k, v in items:
        if k == name:
            return v.decode() if isinstance(v, bytes) else str(v)
    return None


def in_record(msg: Any) -> InRecord:
    """The core's input record of an aiokafka ``ConsumerRecord``."""
    return InRecord(
        msg.value,
        msg.topic,
        msg.partition,
        msg.offset,
        msg.key,
        header(msg.headers, "traceparent"),
    )
