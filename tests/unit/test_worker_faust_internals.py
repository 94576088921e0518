"""The faust internals the worker relies on behave as ``worker/_faust.py`` says.

faust-streaming is pinned; these tests fail first if an upgrade changes what the worker
touches: the consumer's commit bookkeeping (``_acked``, ``_acked_index``, ``_n_acked``,
``_committed_offset``, ``_new_offset``), the fetch step the bulk intake wraps
(``_wait_next_records``, called by ``getmany`` for every fetch) and the current-event
context variable.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace
from typing import Any

import faust
from faust.transport.consumer import Consumer
from faust.types import TP

from prism.pipeline.worker._faust import acknowledge, committed_offset, rebalance_epoch

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
        _n_acked=0,
    )
    ns._committed_offset[TOPIC_TP] = committed
    return ns


def test_acknowledged_offsets_are_what_faust_commits() -> None:
    consumer = _consumer(509)
    app = SimpleNamespace(consumer=consumer)
    assert acknowledge(app, TOPIC_TP, 509, 600) == 92  # type: ignore[arg-type]
    assert consumer._n_acked == 92  # faust's commit-every counter sees them
    assert Consumer._new_offset(consumer, TOPIC_TP) == 601


def test_faust_never_commits_past_offsets_not_acknowledged() -> None:
    # Committed 509; 536..600 acknowledged, 509..535 not (read back, not yet in the ledger).
    consumer = _consumer(509)
    app = SimpleNamespace(consumer=consumer)
    acknowledge(app, TOPIC_TP, 536, 600)  # type: ignore[arg-type]
    assert Consumer._new_offset(consumer, TOPIC_TP) is None
    acknowledge(app, TOPIC_TP, 509, 535)  # type: ignore[arg-type]
    assert Consumer._new_offset(consumer, TOPIC_TP) == 601


def test_acknowledging_again_or_below_the_commit_adds_nothing() -> None:
    consumer = _consumer(100)
    app = SimpleNamespace(consumer=consumer)
    assert acknowledge(app, TOPIC_TP, 90, 119) == 20  # type: ignore[arg-type]
    assert acknowledge(app, TOPIC_TP, 110, 129) == 10  # type: ignore[arg-type]
    assert sorted(consumer._acked[TOPIC_TP]) == list(range(100, 130))
    assert Consumer._new_offset(consumer, TOPIC_TP) == 130


def test_every_fetch_goes_through_wait_next_records() -> None:
    # The bulk intake wraps this one call; getmany (the drain loop's only source) must
    # still fetch through it, on the instance, and yield only what it returned.
    getmany = inspect.getsource(Consumer.getmany)
    assert "await self._wait_next_records(timeout)" in getmany
    assert "self.scheduler.iterate(records)" in getmany
    assert "getmany = self.getmany" in inspect.getsource(Consumer._drain_messages)
    assert "flow_active" in inspect.getsource(Consumer._reset_state)
    assert "suspend_flow" in inspect.getsource(Consumer.stop_flow)


def test_committed_offset_reads_the_consumers_record() -> None:
    app = SimpleNamespace(consumer=_consumer(42))
    assert committed_offset(app, TOPIC_TP) == 42  # type: ignore[arg-type]
    assert committed_offset(app, TP("t.prism.agent-events", 4)) is None  # type: ignore[arg-type]


def test_a_rebalance_is_under_way_from_the_revoke_until_recovery_resumes_the_streams() -> None:
    # rebalance_epoch reads faust's rebalancing flag and count: set before the revoke
    # handlers run, cleared once the tables are recovered. The consumer's generation moves
    # only when the join completes, in between: it alone cannot tell a batch is stale.
    from faust.tables.recovery import Recovery
    from faust.transport.drivers.aiokafka import ConsumerRebalanceListener

    app = faust.App("prism-internals-test")
    assert rebalance_epoch(app) == 0
    app.on_rebalance_start()
    assert rebalance_epoch(app) is None
    app.on_rebalance_end()
    assert rebalance_epoch(app) == 1
    revoked = inspect.getsource(ConsumerRebalanceListener.on_partitions_revoked)
    handlers = revoked.index("thread.on_partitions_revoked(")
    assert revoked.index("app.on_rebalance_start()") < handlers
    assert "consumer_generation_id = generation" in inspect.getsource(
        ConsumerRebalanceListener.on_partitions_assigned
    )
    for done in (Recovery.on_recovery_completed, Recovery._resume_streams):
        source = inspect.getsource(done)
        assert source.index("resume_flow()") < source.index("app.on_rebalance_end()")
