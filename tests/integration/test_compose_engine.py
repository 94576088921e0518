"""docker-compose.yml runs the ClickHouse release the tests run (chDB's embedded engine)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.test_compose import CLICKHOUSE_RELEASE, EXAMPLE, load_compose

pytestmark = pytest.mark.integration


def test_compose_pins_the_clickhouse_release_chdb_embeds(ch_client: Any) -> None:
    engine = str(ch_client.query("SELECT version()").result_rows[0][0])
    release = ".".join(engine.split(".")[:2])
    assert release == CLICKHOUSE_RELEASE, (
        f"chDB runs ClickHouse {engine}; pin clickhouse/clickhouse-server:{release} in "
        "docker-compose.yml so production runs the SQL the tests ran"
    )
    image = load_compose(EXAMPLE)["services"]["clickhouse"]["image"]
    assert image.partition(":")[2].split(".")[:2] == release.split(".")
