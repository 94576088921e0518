"""The worker's intake lanes: each input topic partition its own core partition, and back."""

from __future__ import annotations

import pytest

from prism.pipeline.settings import load_settings
from prism.pipeline.worker._lanes import CHANNEL_LANE, lane_of, source_of


def test_each_input_partition_has_its_own_lane_and_maps_back() -> None:
    topics = load_settings(topic_prefix="acme").topics
    assert topics.channel_operations == "acme.channel-operations"
    assert lane_of(topics, "acme.agent-events", 3) == 3
    assert lane_of(topics, "acme.channel-operations", 3) == CHANNEL_LANE + 3
    assert lane_of(topics, "acme.alerts", 0) is None
    for topic in (topics.input, topics.channel_operations):
        for partition in (0, 1, 1023):
            lane = lane_of(topics, topic, partition)
            assert lane is not None and source_of(topics, lane) == (topic, partition)


@pytest.mark.parametrize("partitions", [1, 1024])
def test_lanes_of_the_two_topics_never_meet(partitions: int) -> None:
    topics = load_settings().topics
    agent = {lane_of(topics, topics.input, p) for p in range(partitions)}
    channel = {lane_of(topics, topics.channel_operations, p) for p in range(partitions)}
    assert not agent & channel and -1 not in agent | channel  # -1 is a file's lane
