"""Create the pipeline's topics up front (input with the configured partitions, outputs).

A broker that is still starting answers with transient errors; ``ensure_topics`` retries
them (``pipeline.retry``) up to ``deadline`` seconds, then fails with one line.
"""

from __future__ import annotations

import contextlib
from typing import Any

from .retry import DEFAULT_DEADLINE, retry_transient
from .settings import Settings

__all__ = ["ensure_topics", "worker_env"]


COMPACTED = {
    "cleanup.policy": "compact",
    "segment.ms": str(10 * 60 * 1000),
    "min.cleanable.dirty.ratio": "0.1",
}
"""Topic settings of the state changelogs and the lane-marks topic."""


async def ensure_topics(
    settings: Settings, *, extra: dict[str, int] | None = None, deadline: float = DEFAULT_DEADLINE
) -> list[str]:
    """Create missing topics; return the names created. Existing topics are left alone."""
    return await retry_transient(
        lambda: _ensure_topics(settings, extra),
        what="creating the pipeline's topics",
        bootstrap=settings.kafka_bootstrap_servers,
        deadline=deadline,
    )


async def _ensure_topics(settings: Settings, extra: dict[str, int] | None) -> list[str]:
    """One attempt: its own admin client, closed whatever happens."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import TopicAlreadyExistsError

    t = settings.topics
    wanted = {
        name: settings.partitions
        for name in (t.input, t.dlq, t.quarantine, t.runs_closed, t.alerts, t.channel_operations)
    }
    wanted[f"{settings.topic_prefix}.limit-deaths"] = 1
    wanted.update(extra or {})
    # The workers' state changelogs, compacted: each key's last write is its state. Made
    # here, before any worker starts, so that every worker finds them (worker/_state.py).
    # A restore reads a partition to its end, so what it reads is bounded by how soon old
    # writes are compacted away: segments roll every 10 minutes (only closed segments are
    # compacted) and the cleaner runs once a tenth of a log is superseded writes.
    compacted = {f"{settings.consumer_group}-{table}-changelog": n for table, n in
                 (("run-state", settings.partitions), ("alert-state", 1))}  # fmt: skip
    compacted[t.lane_marks] = 1  # each lane's latest event-time report (worker/_marks.py)
    wanted.update(compacted)
    admin = AIOKafkaAdminClient(**settings.aiokafka_kwargs())
    try:
        await admin.start()
        existing = set(await admin.list_topics())
        # every record the pipeline reads or writes fits, whatever the broker's default
        # (1 MiB unless message.max.bytes says otherwise): the batch framing on top
        sized = {"max.message.bytes": str(settings.max_message_bytes)}
        new = [
            NewTopic(
                n,
                p,
                settings.replication_factor,
                topic_configs=sized | (COMPACTED if n in compacted else {}),
            )
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
