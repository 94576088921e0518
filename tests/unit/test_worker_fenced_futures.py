"""A fenced producer's leftover future is not an error in the worker's log; others still are.

A short soak's worker log held, for one fence, two ERROR reports "Future exception was
never retrieved" with ``ProducerFenced`` tracebacks: aiokafka's transaction manager sets
the error on a future of its own that nothing awaits once the producer is fenced. The
worker handles the fence (``Fenced``); the leftover report goes to DEBUG.
"""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest
from aiokafka.errors import KafkaConnectionError, ProducerFenced

from prism.pipeline.worker._checkpoint import quiet_fenced_futures


def _abandon(loop: asyncio.AbstractEventLoop, exc: BaseException) -> None:
    fut = loop.create_future()
    fut.set_exception(exc)
    del fut  # never retrieved: the loop reports it when it is collected


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_fenced_producers_leftover_future_is_reported_at_debug_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = asyncio.new_event_loop()
    try:
        quiet_fenced_futures(loop)
        with caplog.at_level(logging.DEBUG):
            _abandon(loop, ProducerFenced())
            gc.collect()
    finally:
        loop.close()
    assert _errors(caplog) == []
    assert any("fenced producer" in r.getMessage() for r in caplog.records)


def test_every_other_leftover_error_is_still_reported(caplog: pytest.LogCaptureFixture) -> None:
    loop = asyncio.new_event_loop()
    try:
        quiet_fenced_futures(loop)
        with caplog.at_level(logging.DEBUG):
            _abandon(loop, KafkaConnectionError("broker gone"))
            _abandon(loop, ValueError("boom"))
            gc.collect()
    finally:
        loop.close()
    errors = _errors(caplog)
    assert len(errors) == 2 and all("never retrieved" in m for m in errors), errors


def test_a_handler_the_loop_had_keeps_every_other_report() -> None:
    loop = asyncio.new_event_loop()
    seen: list[object] = []
    try:
        loop.set_exception_handler(lambda _loop, context: seen.append(context.get("exception")))
        quiet_fenced_futures(loop)
        fenced, other = ProducerFenced(), ValueError("boom")
        _abandon(loop, fenced)
        _abandon(loop, other)
        gc.collect()
    finally:
        loop.close()
    assert seen == [other]
