"""``ensure_topics`` makes every topic the pipeline and its workers use, before any worker;
``check_partitions`` refuses an input whose partition count the state was not kept for."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from prism.pipeline.settings import load_settings
from prism.pipeline.topics import PartitionsChanged, check_partitions, ensure_topics

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
            keys = ("segment.ms", "segment.bytes", "min.cleanable.dirty.ratio")
            compaction = {n: tuple(found_configs[n][k] for k in keys) for n in names[:2]}
            wanted = ("60000", str(16 * 1024 * 1024), "0.1")
            assert compaction == dict.fromkeys(names[:2], wanted), compaction
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


def test_a_changed_partition_count_is_refused_with_the_way_to_migrate(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    settings = load_settings(
        kafka_bootstrap_servers=kafka_bootstrap,
        topic_prefix=topic_prefix,
        consumer_group=f"{topic_prefix}-group",
        partitions=3,
    )
    asyncio.run(ensure_topics(settings))
    asyncio.run(check_partitions(settings))  # as made: nothing to say
    with pytest.raises(PartitionsChanged, match="PRISM_PARTITIONS is 4"):
        asyncio.run(check_partitions(settings.model_copy(update={"partitions": 4})))

    async def grow() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            await admin.create_partitions({settings.topics.input: NewPartitions(6)})
            for _ in range(300):  # until the broker's metadata shows them
                found = await admin.describe_topics([settings.topics.input])
                if len(found[0]["partitions"]) == 6:
                    break
                await asyncio.sleep(0.1)
        finally:
            await admin.close()

    asyncio.run(grow())
    with pytest.raises(PartitionsChanged) as refused:
        asyncio.run(check_partitions(settings))
    text = str(refused.value)
    assert f"{settings.topics.input} has 6" in text and "kept for 3 partitions" in text
    assert "new PRISM_CONSUMER_GROUP" in text and "rebuild --database" in text
    # the worker says so in one line before it joins the group, and exits non-zero
    env = {
        **os.environ,
        "PRISM_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "PRISM_TOPIC_PREFIX": topic_prefix,
        "PRISM_CONSUMER_GROUP": settings.consumer_group,
        "PRISM_PARTITIONS": "3",
        "PRISM_CLICKHOUSE_DSN": f"chdb://{tmp_path / 'ledger'}",
        "PRISM_STATE_DIR": str(tmp_path / "state"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "prism.pipeline.cli", "worker"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-2000:]
    assert "kept for 3 partitions" in done.stderr and "Traceback" not in done.stderr
