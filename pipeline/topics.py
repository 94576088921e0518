"""Create the pipeline's topics up front (input with the configured partitions, outputs)."""

from __future__ import annotations

import contextlib
from typing import Any

from .settings import Settings

__all__ = ["ensure_topics", "worker_env"]


async def ensure_topics(settings: Settings, *, extra: dict[str, int] | None = None) -> list[str]:
    """Create missing topics; return the names created. Existing topics are left alone."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import TopicAlreadyExistsError

    t = settings.topics
    wanted = {
        name: settings.partitions
        for name in (t.input, t.dlq, t.quarantine, t.runs_closed, t.alerts)
    }
    wanted[f"{settings.topic_prefix}.limit-deaths"] = 1
    wanted.update(extra or {})
    admin = AIOKafkaAdminClient(**settings.aiokafka_kwargs())
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        new = [
            NewTopic(n, p, settings.replication_factor)
            for n, p in wanted.items()
            if n not in existing
        ]
        if new:
            with contextlib.suppress(TopicAlreadyExistsError):
                await admin.create_topics(new)
        return [n.name for n in new]
    finally:
        await admin.close()


def worker_env(settings: Settings) -> dict[str, Any]:
    """PRISM_* environment that reproduces ``settings`` in a child process."""
    out: dict[str, Any] = {}
    for name, value in settings.model_dump().items():
        if value is None:
            continue
        if hasattr(value, "get_secret_value"):
            value = value.get_secret_value()
        if isinstance(value, (set, frozenset)):  # a list setting (PRISM_REDACT_KEYS) is a,b,c
            value = ",".join(sorted(value))
        out[f"PRISM_{name.upper()}"] = str(value)
    return out
