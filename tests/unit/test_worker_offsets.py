"""Offset continuity: the ranges a batch is missing, which the worker reads back."""

from __future__ import annotations

import pytest

from prism.pipeline.worker._offsets import missing_ranges


@pytest.mark.parametrize(
    ("expected", "offsets", "gaps"),
    [
        (None, [5, 6, 7], []),  # nothing known yet: only holes inside the batch count
        (None, [5, 7, 8], [(6, 7)]),  # one record abandoned mid-batch
        (5, [5, 6], []),
        (282, [539, 540], [(282, 539)]),  # a whole range dropped after a rebalance
        (10, [8, 9, 10, 11], []),  # re-delivery below what was processed is no gap
        (10, [12, 15], [(10, 12), (13, 15)]),
        (10, [], []),
    ],
)
def test_missing_ranges(expected, offsets, gaps):
    assert missing_ranges(expected, offsets) == gaps
