"""Shared fixtures: the real Kafka broker, per-test topics, the embedded chDB engine.

The broker is the one ``make test`` started (``PRISM_TEST_KAFKA_BOOTSTRAP``) or, when
pytest runs alone, one this session starts on a free port. Integration tests never skip
when the broker is missing: the fixture fails with the reason.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from prism.devstack import LocalKafka, free_port

# Property tests: a fixed seed and a bounded search in CI; `--hypothesis-profile=deep`
# searches longer on a developer's machine.
settings.register_profile("ci", max_examples=60, derandomize=True, deadline=None)
settings.register_profile("deep", max_examples=3000, deadline=None)
settings.load_profile("ci")


def pytest_report_header() -> str:
    from prism.pipeline import core

    return f"core: {'compiled (mypyc)' if core.COMPILED else 'Python source'} (PRISM_CORE)"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """On the compiled core, skip the few tests that replace one of its functions: its
    modules call each other directly, so the replacement is never called."""
    from prism.pipeline import core

    if not core.COMPILED:
        return
    skip = pytest.mark.skip(reason="replaces a core function; compiled code calls its own")
    for item in items:
        if item.get_closest_marker("pure_core"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Bootstrap servers of a real, running Kafka broker."""
    given = os.environ.get("PRISM_TEST_KAFKA_BOOTSTRAP")
    if given:
        yield given
        return
    broker = LocalKafka(state_dir=tmp_path_factory.mktemp("kafka"), port=free_port())
    try:
        broker.up()
    except Exception as exc:  # fail, never skip
        pytest.fail(f"could not start the local Kafka broker: {exc}", pytrace=False)
    try:
        yield broker.bootstrap
    finally:
        broker.down()


@pytest.fixture
def topic_prefix() -> str:
    """A random topic prefix so tests never see each other's records."""
    return f"t{uuid.uuid4().hex[:10]}.prism"


@pytest.fixture(scope="session")
def chdb_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The one chDB engine path of this test process (chDB allows one per process)."""
    return tmp_path_factory.mktemp("chdb") / "ledger"


@pytest.fixture(scope="session")
def ch_client(chdb_path: Path):
    """A clickhouse-connect client on the embedded chDB engine."""
    import clickhouse_connect

    from prism.sinks import close_client

    client = clickhouse_connect.get_client(dsn=f"chdb://{chdb_path}")
    yield client
    close_client(client)  # and the handles a writer or a timeline opened beside it


@pytest.fixture
def ch_database(ch_client) -> Iterator[str]:
    """A fresh, randomly named database per test, dropped afterwards."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    ch_client.command(f"CREATE DATABASE {name}")
    try:
        yield name
    finally:
        ch_client.command(f"DROP DATABASE IF EXISTS {name} SYNC")
