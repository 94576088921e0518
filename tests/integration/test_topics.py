"""``ensure_topics`` makes every topic the pipeline and its workers use, before any worker."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from prism.pipeline.settings import load_settings
from prism.pipeline.topics import ensure_topics

pytestmark = pytest.mark.integration


def test_topics_and_the_table_changelogs_are_created_once(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    settings = load_settings(
        kafka_bootstrap_servers=kafka_bootstrap,
        topic_prefix=topic_prefix,
        consumer_group=f"{topic_prefix}-group",  # its changelogs are this test's alone
        partitions=3,
    )
    group = settings.consumer_group

    async def scenario() -> tuple[list[str], list[str], dict[str, tuple[int, str, int]]]:
        first = await ensure_topics(settings)
        again = await ensure_topics(settings)
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            names = [f"{group}-run-state-changelog", f"{group}-alert-state-changelog",
                     settings.topics.input]  # fmt: skip
            found = await admin.describe_topics(names)
            described = {d["topic"]: len(d["partitions"]) for d in found}
            configs = await admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, n) for n in names]
            )
            found_configs = {
                res[3]: dict((e[0], e[1]) for e in res[4]) for r in configs for res in r.resources
            }
            compaction = {
                n: (found_configs[n]["segment.ms"], found_configs[n]["min.cleanable.dirty.ratio"])
                for n in names[:2]
            }
            assert compaction == dict.fromkeys(names[:2], ("600000", "0.1")), compaction
            return first, again, {
                n: (described[n], found_configs[n]["cleanup.policy"],
                    int(found_configs[n]["max.message.bytes"]))
                for n in names
            }  # fmt: skip
        finally:
            await admin.close()

    first, again, topics = asyncio.run(scenario())
    assert again == []
    assert f"{group}-run-state-changelog" in first
    # every topic takes the largest record a worker writes, whatever the broker's default
    size = settings.max_record_bytes + 65_536
    assert topics == {
        f"{group}-run-state-changelog": (3, "compact", size),
        f"{group}-alert-state-changelog": (1, "compact", size),
        settings.topics.input: (3, "delete", size),
    }
