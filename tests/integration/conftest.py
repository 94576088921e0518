"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_faults_harness import FaultLab


@pytest.fixture
def lab(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> Iterator[FaultLab]:
    lab = FaultLab(kafka_bootstrap, topic_prefix, tmp_path)
    try:
        yield lab
    finally:
        lab.close()
