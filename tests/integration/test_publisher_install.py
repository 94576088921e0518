"""The publisher-only install: a runtime that wants ``EventPublisher`` gets no pipeline.

Builds the project's wheel, installs it without extras into a fresh virtualenv (its few
dependencies come from the package index, or pip's cache), then publishes through
``prism.runtime.EventPublisher`` to the test broker from that venv and reads the record
back here. The venv must not hold chDB, clickhouse-connect, pydantic-settings or the Grafana SDK.
"""

from __future__ import annotations

import asyncio
import json
import os
import venv
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer

from tests.fixtures.wheel import project_wheel, run_ok

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

PIPELINE_ONLY = ("chdb", "clickhouse_connect", "grafana_foundation_sdk", "pydantic_settings")

PUBLISH = """
import asyncio, importlib.util, json, sys
from prism.runtime import EventPublisher, RunEmitter

async def main(bootstrap, topic):
    pub = EventPublisher(bootstrap, topic=topic, raise_errors=True)
    await pub.start()
    RunEmitter(pub, "wheel-run", tenant_id="acme").emit("agent_started", {})
    assert await pub.flush(timeout=60), "the broker did not acknowledge the event"
    await pub.close()

asyncio.run(main(sys.argv[1], sys.argv[2]))
print(json.dumps({m: importlib.util.find_spec(m) is not None for m in sys.argv[3:]}))
"""


def test_the_publisher_only_wheel_publishes_without_the_pipeline(
    tmp_path: Path, kafka_bootstrap: str, topic_prefix: str
) -> None:
    wheel = project_wheel(tmp_path / "dist")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = str(env_dir / "bin" / "python")
    run_ok([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel)])
    topic = f"{topic_prefix}.agent-events"
    # the wheel is an install of its own, with no compiled build: PRISM_CORE=compiled (make
    # test's) is this checkout's demand, so the publisher runs with the default
    env = {k: v for k, v in os.environ.items() if k != "PRISM_CORE"}
    out = run_ok(
        [python, "-c", PUBLISH, kafka_bootstrap, topic, *PIPELINE_ONLY], cwd=str(tmp_path), env=env
    )
    installed = json.loads(out.stdout.strip().splitlines()[-1])
    assert installed == dict.fromkeys(PIPELINE_ONLY, False)
    value = asyncio.run(_first_value(kafka_bootstrap, topic))
    event = json.loads(value)
    assert (event["runId"], event["type"], event["tenantId"]) == (
        "wheel-run",
        "agent_started",
        "acme",
    )


async def _first_value(bootstrap: str, topic: str) -> bytes:
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    try:
        msg = await asyncio.wait_for(consumer.getone(), timeout=60)
        return msg.value or b""
    finally:
        await consumer.stop()
