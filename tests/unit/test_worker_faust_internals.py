"""The faust internals the worker relies on behave as ``worker/_faust.py`` says.

faust-streaming is pinned; these tests fail first if an upgrade changes what the worker
touches: the consumer's commit bookkeeping (``_acked``, ``_gap``, ``_committed_offset``,
``_add_gap``, ``_new_offset``) and the current-event context variable.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import faust
from faust.transport.consumer import Consumer
from faust.types import TP

from prism.pipeline.worker._faust import committed_offset, handled_elsewhere

TOPIC_TP = TP("t.prism.agent-events", 3)


def _consumer(committed: int | None) -> Any:
    """Just the commit bookkeeping of a faust Consumer, with the real methods bound to it."""
    from collections import defaultdict

    from intervaltree import IntervalTree

    ns = SimpleNamespace(
        _acked=defaultdict(list),
        _acked_index=defaultdict(set),
        _gap=defaultdict(IntervalTree),
        _committed_offset=defaultdict(lambda: None),
    )
    ns._committed_offset[TOPIC_TP] = committed
    ns._add_gap = lambda tp, a, b: Consumer._add_gap(ns, tp, a, b)  # type: ignore[arg-type]
    return ns


def _ack(consumer: Any, offsets: range) -> None:
    consumer._acked[TOPIC_TP].extend(offsets)
    consumer._acked_index[TOPIC_TP].update(offsets)


def test_a_skipped_range_blocks_the_commit_until_it_is_marked_handled() -> None:
    # Committed 509; the consumer skipped 509..535 and delivered 536..600, acknowledged.
    consumer = _consumer(509)
    _ack(consumer, range(536, 601))
    assert Consumer._new_offset(consumer, TOPIC_TP) is None  # faust never commits past it

    app = SimpleNamespace(consumer=consumer)
    asyncio.run(handled_elsewhere(app, TOPIC_TP, [(509, 536)]))  # type: ignore[arg-type]
    assert Consumer._new_offset(consumer, TOPIC_TP) == 601


def test_marking_handled_never_commits_beyond_what_was_acknowledged() -> None:
    # The read-back range is registered before any later offset is acknowledged: nothing
    # becomes committable until the batch above it is acknowledged.
    consumer = _consumer(100)
    app = SimpleNamespace(consumer=consumer)
    asyncio.run(handled_elsewhere(app, TOPIC_TP, [(100, 120)]))  # type: ignore[arg-type]
    assert Consumer._new_offset(consumer, TOPIC_TP) is None
    _ack(consumer, range(120, 130))
    assert Consumer._new_offset(consumer, TOPIC_TP) == 130


def test_committed_offset_reads_the_consumers_record() -> None:
    app = SimpleNamespace(consumer=_consumer(42))
    assert committed_offset(app, TOPIC_TP) == 42  # type: ignore[arg-type]
    assert committed_offset(app, TP("t.prism.agent-events", 4)) is None  # type: ignore[arg-type]


def test_the_current_event_context_variable_is_where_tables_read_it() -> None:
    from faust.streams import _current_event
    from faust.tables import base

    assert base.current_event.__module__ == "faust.streams"
    assert _current_event.name == "current_event"
    assert faust.__version__ == "0.15.3", "faust internals are pinned: re-check this module"
