"""Create the pipeline's topics up front (input with the configured partitions, outputs).

A broker that is still starting answers with transient errors; ``ensure_topics`` retries
them (``pipeline.retry``) up to ``deadline`` seconds, then fails with one line.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from .retry import DEFAULT_DEADLINE, retry_transient
from .settings import Settings

__all__ = ["PartitionsChanged", "check_partitions", "ensure_topics", "worker_env"]


class PartitionsChanged(RuntimeError):
    """The input's partition count differs from the one the pipeline's state was kept for."""


COMPACTED = {
    "cleanup.policy": "compact",
    "segment.ms": str(60 * 1000),
    "segment.bytes": str(16 * 1024 * 1024),
    "min.cleanable.dirty.ratio": "0.1",
}
"""Topic settings of the state changelogs, the lane-marks and the budget-state topics."""


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
        for name in (t.input, t.dlq, t.quarantine, t.runs_closed, t.alerts, *t.slot_topics)
    }
    wanted[f"{settings.topic_prefix}.limit-deaths"] = 1
    wanted.update(extra or {})
    # The workers' state changelogs, compacted: each key's last write is its state. Made
    # here, before any worker starts, so that every worker finds them (worker/_state.py).
    # A restore reads a partition to its end, so what it reads is bounded by how soon old
    # writes are compacted away: segments roll every minute or 16 MiB (only closed segments
    # are compacted) and the cleaner runs once a tenth of a log is superseded writes. With
    # 10-minute segments a 3-minute soak at 3,000 events/s left 70-90 MB uncompacted per
    # state partition, and restores of up to 23 s.
    compacted = {f"{settings.consumer_group}-{table}-changelog": n for table, n in
                 (("run-state", settings.partitions), ("alert-state", 1))}  # fmt: skip
    compacted[t.lane_marks] = 1  # each lane's latest event-time report (worker/_marks.py)
    if settings.budgets_file is not None:  # the budget desk's (docs/BUDGETS.md)
        compacted[t.budget_state] = 1  # each budget's current state, keyed by scope id
        compacted[f"{settings.consumer_group}-budget-state-changelog"] = 1  # the desk's state
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
                response = await admin.create_topics(new)
                _raise_refused(response)
            await _visible(admin, [n.name for n in new])
        return [n.name for n in new]
    finally:
        await admin.close()


def _raise_refused(response: Any) -> None:
    """A topic the broker refused to create (a bad config, a policy): one line naming it."""
    from aiokafka.errors import TopicAlreadyExistsError, for_code

    for name, code, *rest in getattr(response, "topic_errors", []):
        if code and for_code(code) is not TopicAlreadyExistsError:
            message = rest[0] if rest and rest[0] else for_code(code).__name__
            raise RuntimeError(f"the broker refused to create topic {name!r}: {message}")


async def _visible(admin: Any, names: list[str], timeout_s: float = 30.0) -> None:
    """Wait until the broker lists every topic just made: a check that reads topics right
    after (``check_partitions``) must not find one missing and take it for absent."""
    give_up = asyncio.get_running_loop().time() + timeout_s
    while True:
        missing = set(names) - set(await admin.list_topics())
        if not missing or asyncio.get_running_loop().time() > give_up:
            return
        await asyncio.sleep(0.1)


async def check_partitions(settings: Settings, *, deadline: float = DEFAULT_DEADLINE) -> None:
    """Refuse to run when the input topics' partition count is not the one the lanes' state
    was kept for (the run-state changelog's), nor ``PRISM_PARTITIONS``.

    A run's home partition is the default partitioner's hash of its ``runId`` modulo the
    count: adding partitions moves most runs' home, so their open state would be read by
    lanes that never see their events again (schemas/CONTRACT.md, Transport).
    """
    t = settings.topics
    state = f"{settings.consumer_group}-run-state-changelog"
    counts = await retry_transient(
        lambda: _partition_counts(settings, [t.input, t.channel_operations, state]),
        what="reading the pipeline's partition counts",
        bootstrap=settings.kafka_bootstrap_servers,
        deadline=deadline,
    )
    kept = counts.get(state)
    found = {n: c for n, c in counts.items() if n != state}
    if kept is None or set(found.values()) | {settings.partitions} == {kept}:
        return
    listed = [f"{n} has {c}" for n, c in sorted(found.items())]
    listed.append(f"PRISM_PARTITIONS is {settings.partitions}")
    raise PartitionsChanged(
        f"the pipeline's state was kept for {kept} partitions ({state}) but "
        f"{', '.join(listed)}: a run's home partition is its runId's "
        "hash modulo the count, so a changed count moves most open runs away from their "
        "state. To migrate: stop the producers (or wait until the open runs closed), let "
        f"every worker of group {settings.consumer_group} drain, then start the workers "
        "under a new PRISM_CONSUMER_GROUP with PRISM_PARTITIONS set to the topics' count "
        "(their state changelogs are made for it); or rebuild the ledger from the topics "
        "into a new database (prism-pipeline rebuild --database NEW), which reads every "
        "partition. Or put the partition count back."
    )


async def _partition_counts(settings: Settings, names: list[str]) -> dict[str, int]:
    """Partitions of each of ``names`` that exists, from one admin client's metadata."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(**settings.aiokafka_kwargs())
    try:
        await admin.start()
        existing = set(await admin.list_topics())
        found = await admin.describe_topics([n for n in names if n in existing])
        return {d["topic"]: len(d["partitions"]) for d in found}
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
