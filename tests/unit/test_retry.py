"""Transient broker errors at start-up are retried with backoff, then end in one line."""

from __future__ import annotations

import socket

import pytest
from aiokafka.errors import (
    AuthenticationFailedError,
    KafkaConnectionError,
    LeaderNotAvailableError,
    NodeNotReadyError,
    RequestTimedOutError,
)

from prism.pipeline.retry import BrokerUnavailable, is_transient, retry_transient
from prism.pipeline.settings import load_settings
from prism.pipeline.topics import ensure_topics


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


async def test_transient_errors_are_retried_with_growing_delays_until_success() -> None:
    t = FakeTime()
    errors = [NodeNotReadyError(1), LeaderNotAvailableError(), RequestTimedOutError()]

    async def op() -> str:
        if errors:
            raise errors.pop(0)
        return "topics"

    got = await retry_transient(
        op, what="listing topics", bootstrap="b:9092", sleep=t.sleep, clock=t.clock
    )
    assert got == "topics"
    assert t.sleeps == [0.25, 0.5, 1.0]


async def test_after_the_deadline_one_line_names_the_step_the_broker_and_the_error() -> None:
    t = FakeTime()
    calls = 0

    async def op() -> None:
        nonlocal calls
        calls += 1
        raise NodeNotReadyError("node 1 not ready")

    with pytest.raises(BrokerUnavailable) as info:
        await retry_transient(
            op,
            what="creating the pipeline's topics",
            bootstrap="127.0.0.1:9092",
            deadline=10,
            sleep=t.sleep,
            clock=t.clock,
        )
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("creating the pipeline's topics: the Kafka broker at 127.0.0.1:9092")
    assert "NodeNotReadyError: node 1 not ready" in message
    assert f"after {calls} attempts in 10s" in message
    assert t.now == pytest.approx(10)  # waited the whole deadline, no more
    assert max(t.sleeps) == 4.0  # the backoff is capped


async def test_errors_that_are_not_transient_are_raised_at_once() -> None:
    t = FakeTime()

    async def op() -> None:
        raise AuthenticationFailedError("bad password")

    with pytest.raises(AuthenticationFailedError):
        await retry_transient(op, what="x", bootstrap="b", sleep=t.sleep, clock=t.clock)
    assert t.sleeps == []


def test_which_errors_count_as_transient() -> None:
    assert is_transient(NodeNotReadyError(1))
    assert is_transient(KafkaConnectionError("refused"))
    assert is_transient(TimeoutError())
    assert is_transient(ConnectionRefusedError())
    assert not is_transient(AuthenticationFailedError())
    assert not is_transient(ValueError("bug"))


def _closed_port() -> int:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_ensure_topics_against_no_broker_fails_in_one_line_after_its_deadline() -> None:
    port = _closed_port()
    settings = load_settings(kafka_bootstrap_servers=f"127.0.0.1:{port}")
    with pytest.raises(BrokerUnavailable, match=f"creating the pipeline's topics: .*:{port}"):
        await ensure_topics(settings, deadline=1.0)


async def test_a_replay_consumer_start_against_no_broker_fails_in_one_line() -> None:
    from prism.pipeline.replay._tail import _consumer

    port = _closed_port()
    consumer = _consumer(load_settings(kafka_bootstrap_servers=f"127.0.0.1:{port}"), deadline=1.0)
    try:
        with pytest.raises(BrokerUnavailable, match=f"starting a Kafka consumer: .*:{port}"):
            await consumer.start()
    finally:
        await consumer.stop()


def test_the_drain_check_against_no_broker_fails_in_one_line() -> None:
    from prism.devstack.workerproc import committed_lag

    port = _closed_port()
    with pytest.raises(BrokerUnavailable) as info:
        committed_lag(f"127.0.0.1:{port}", "g", "t.agent-events", deadline=1.0)
    assert str(info.value).startswith("reading the lag of consumer group 'g' on t.agent-events")
    assert "\n" not in str(info.value)
