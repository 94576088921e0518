"""Who serves and who leads in a local cluster: registered brokers, partition leaders, controller.

Brokers and partitions come from a metadata request (aiokafka's admin client); the active
controller from the nodes' own ``quorum-state`` files, since in KRaft the controller is not
visible to clients (their metadata names a random broker instead).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["partition_state", "quorum_leader", "registered_brokers", "topic_states"]


async def _metadata(bootstrap: str, topics: list[str] | None) -> dict[str, Any]:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    try:
        await admin.start()
        if topics is None:
            return await admin.describe_cluster()
        if not topics:
            topics = list(await admin.list_topics())
        return {"topics": await admin.describe_topics(topics)}
    finally:
        with contextlib.suppress(Exception):
            await admin.close()


def registered_brokers(bootstrap: str) -> set[int]:
    """Ids of the brokers the cluster's metadata lists (registered and not fenced)."""
    try:
        meta = asyncio.run(_metadata(bootstrap, None))
    except Exception:  # nothing answers yet
        return set()
    return {int(b["node_id"]) for b in meta.get("brokers", [])}


def partition_state(bootstrap: str, topic: str) -> dict[int, tuple[int, list[int]]]:
    """``partition -> (leader id or -1, in-sync replica ids)`` of ``topic``.

    Raises ``LookupError`` when the topic is unknown or its metadata carries an error.
    """
    state = topic_states(bootstrap, [topic])[topic]
    if not state:
        raise LookupError(f"topic {topic!r} has no partitions in the cluster's metadata")
    return state


def topic_states(bootstrap: str, topics: list[str]) -> dict[str, dict[int, tuple[int, list[int]]]]:
    """``partition_state`` of several topics in one request (every topic when empty)."""
    meta = asyncio.run(_metadata(bootstrap, topics))
    out: dict[str, dict[int, tuple[int, list[int]]]] = {}
    for t in meta["topics"]:
        name = t.get("topic", t.get("name"))
        if t.get("error_code", 0):
            raise LookupError(f"topic {name!r}: metadata error code {t['error_code']}")
        parts = out.setdefault(name, {})
        for p in t["partitions"]:
            isr = p.get("isr", p.get("isr_nodes", []))
            parts[int(p["partition"])] = (int(p["leader"]), sorted(int(i) for i in isr))
    return out


def quorum_leader(data_dirs: Iterable[Path]) -> int | None:
    """The controller quorum's leader per the freshest ``quorum-state`` among ``data_dirs``."""
    best: tuple[int, int] | None = None  # (epoch, leader id)
    for data in data_dirs:
        try:
            state = json.loads((data / "__cluster_metadata-0" / "quorum-state").read_text())
        except (OSError, ValueError):
            continue
        leader, epoch = int(state.get("leaderId", -1)), int(state.get("leaderEpoch", -1))
        if leader >= 0 and (best is None or epoch > best[0]):
            best = (epoch, leader)
    return None if best is None else best[1]
