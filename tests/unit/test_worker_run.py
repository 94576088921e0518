"""The worker's start-up: the GIL switch interval it runs its loop under."""

from __future__ import annotations

import math
import sys

import pytest
from pydantic import ValidationError

from prism.pipeline.settings import Settings
from prism.pipeline.worker import _run


def test_the_switch_interval_holds_inside_and_is_restored_after() -> None:
    before = sys.getswitchinterval()
    with _run.switch_interval(0.037):
        assert math.isclose(sys.getswitchinterval(), 0.037)
    assert sys.getswitchinterval() == before


def test_the_switch_interval_is_restored_when_the_worker_fails() -> None:
    before = sys.getswitchinterval()
    with pytest.raises(RuntimeError, match="boom"), _run.switch_interval(0.2):
        raise RuntimeError("boom")
    assert sys.getswitchinterval() == before


@pytest.mark.parametrize("bad", [0, 0.0005, 1.5, float("nan"), float("inf")])
def test_an_out_of_range_switch_interval_is_refused_by_name(bad: float) -> None:
    with pytest.raises(ValidationError, match="gil_switch_interval_seconds"):
        Settings(gil_switch_interval_seconds=bad)


def test_run_worker_runs_the_loop_under_the_configured_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from prism.pipeline import topics

    seen: list[float] = []

    class FakePipelineWorker:
        telemetry = None

        async def run(self) -> None:
            seen.append(sys.getswitchinterval())

        def stop(self) -> None: ...

    async def no_topics(settings: Settings) -> list[str]:
        return []

    monkeypatch.setattr(topics, "ensure_topics", no_topics)

    async def counts_agree(settings: Settings) -> None:
        return None  # no broker in a unit test

    monkeypatch.setattr(topics, "check_partitions", counts_agree)
    monkeypatch.setattr(_run, "build_worker", lambda settings, hooks=None: FakePipelineWorker())
    before = sys.getswitchinterval()
    settings = Settings(metrics_port=0, gil_switch_interval_seconds=0.08)
    assert _run.run_worker(settings) == 0
    assert len(seen) == 1 and math.isclose(seen[0], 0.08)
    assert sys.getswitchinterval() == before
    assert math.isclose(Settings.model_fields["gil_switch_interval_seconds"].default, 0.05)
