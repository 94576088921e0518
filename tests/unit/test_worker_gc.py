"""The worker's GC policy: survivors frozen after a batch, a full pass on its cadence."""

from __future__ import annotations

import gc

from prism.pipeline.worker._gc import GcPolicy


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_a_batch_runs_without_collections_and_its_survivors_are_frozen() -> None:
    policy = GcPolicy(full_every=60.0, clock=lambda: 0.0)
    try:
        with policy.batch():
            assert not gc.isenabled()
            state = [{"run": i} for i in range(1000)]
        assert gc.isenabled()
        assert gc.get_freeze_count() >= len(state)
    finally:
        gc.unfreeze()


def test_a_failing_batch_turns_collection_back_on() -> None:
    policy = GcPolicy()
    try:
        with policy.batch():
            raise ValueError("boom")
    except ValueError:
        pass
    finally:
        gc.unfreeze()
    assert gc.isenabled()


def test_the_full_pass_runs_on_its_cadence_and_frees_frozen_cycles() -> None:
    now = [0.0]
    policy = GcPolicy(full_every=60.0, clock=lambda: now[0])
    try:
        with policy.batch():
            garbage = _Node()  # the cycle is frozen with the survivors
        del garbage
        assert not policy.maybe_collect()  # too soon
        now[0] = 61.0
        assert policy.maybe_collect()
        assert policy.full_passes == 1
        assert policy.last_pause > 0
        assert policy.collected >= 1  # the frozen cycle was found once unfrozen
        assert not any(type(o) is _Node for o in gc.get_objects())
        assert gc.get_freeze_count() > 0  # and what survives is frozen again
    finally:
        gc.unfreeze()


def test_a_long_full_pass_puts_the_next_one_off_to_keep_its_share_of_the_time() -> None:
    now = [0.0]
    policy = GcPolicy(full_every=60.0, duty=0.01, clock=lambda: now[0])
    assert policy.interval == 60.0
    policy.last_pause = 5.0  # as a pass over a few GB of objects takes
    assert policy.interval == 500.0
    now[0] = 499.0
    assert not policy.maybe_collect()
    now[0] = 501.0
    try:
        assert policy.maybe_collect()
    finally:
        gc.unfreeze()
    assert policy.figures()["gc_full_passes"] == 1
    assert policy.interval == max(60.0, policy.last_pause / 0.01)
