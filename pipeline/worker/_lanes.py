"""Intake lanes of the worker: each input topic partition gets its own core partition.

The agent-event topic's partition ``p`` is lane ``p``; the channel-operation topic's is
lane ``CHANNEL_LANE + p``. A lane has its own processors, next offset and watermark mark,
while its state keys (which name the lane) are written under an event of the Kafka
partition ``p``, so they land in changelog partition ``p``, which the consumer group
assigns together with both topics' partition ``p``.
"""

from __future__ import annotations

from ..settings import Topics

__all__ = ["CHANNEL_LANE", "lane_of", "source_of"]

CHANNEL_LANE = 1 << 16  # above any partition count the settings allow (1024)


def lane_of(topics: Topics, topic: str, partition: int) -> int | None:
    """The lane of a topic partition (None: not an input topic)."""
    if topic == topics.input:
        return partition
    if topic == topics.channel_operations:
        return CHANNEL_LANE + partition
    return None


def source_of(topics: Topics, lane: int) -> tuple[str, int]:
    """The input topic and Kafka partition of a lane."""
    if lane >= CHANNEL_LANE:
        return topics.channel_operations, lane - CHANNEL_LANE
    return topics.input, lane
