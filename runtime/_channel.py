"""``ChannelEmitter``: a channel operation's transitions with ``seq``, ``eventId``, ``ts`` set.

Records follow ``prism.channel-operation/v1`` (schemas/CONTRACT.md, "Channel operations")
and go to the publisher's channel topic (``prism.channel-operations``), keyed by
``operationId``, or by ``connectionId`` for a denied admission, which has no operation id.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from prism.schemas import CHANNEL_SCHEMA_ID

from ._emitter import timestamp, wire_part
from ._ids import new_event_id

if TYPE_CHECKING:
    from ._base import Publisher, PublishResult

__all__ = ["ChannelEmitter"]


class ChannelEmitter:
    """Emits the transitions of one channel operation so ``seq`` and ``eventId`` come out right.

    ``seq`` starts at ``first_seq`` (0 for a new operation; a host that reconciles an
    operation journaled by another process passes the next one) and grows by one per
    published record; a record the publisher rejects uses up no ``seq``. ``eventId`` is a
    UUIDv7 and ``ts`` the transition time in UTC. ``run_id`` and ``session_id`` given to
    ``emit`` are kept for later transitions (a run becomes known once the operation runs).
    The pipeline checks the order of states (``admitted`` -> ``executing`` -> ...); the
    emitter sends what it is told, so a host's journal stays the one source of truth.

    Without ``operation_id`` the emitter stands for one denied admission (``deny``).

    Example::

        op = publisher.channel("telegram:support", "op-81", kind="message", tenant_id="acme")
        op.emit("admitted")
        op.emit("executing", run_id="run-42")
        op.emit("delivery_unknown")          # the send threw: an open item for on-call
        publisher.deny("telegram:support", "capacity", tenant_id="acme")
    """

    def __init__(
        self,
        publisher: Publisher,
        connection_id: str,
        operation_id: str | None = None,
        *,
        kind: str = "message",
        tenant_id: str | None = None,
        session_id: str | None = None,
        run_id: str | None = None,
        agent: str | Mapping[str, Any] | Any = None,
        first_seq: int = 0,
    ) -> None:
        if not isinstance(connection_id, str) or not connection_id:
            raise ValueError(f"connection_id must be a non-empty string, got {connection_id!r}")
        if operation_id is not None and (not isinstance(operation_id, str) or not operation_id):
            raise ValueError(
                f"operation_id must be a non-empty string (or None for a denial), "
                f"got {operation_id!r}"
            )
        if first_seq < 0:
            raise ValueError(f"first_seq must be >= 0, got {first_seq!r}")
        self._publisher = publisher
        self._connection_id = connection_id
        self._operation_id = operation_id
        self._kind = kind
        self._next_seq = first_seq
        self._state: str | None = None
        self._fields: dict[str, Any] = {
            "runId": run_id,
            "sessionId": session_id,
            "tenantId": tenant_id,
            "agent": {"id": agent} if isinstance(agent, str) else wire_part(agent, "agent"),
        }

    @property
    def operation_id(self) -> str | None:
        """The operation every record of this emitter belongs to (``None``: a denial)."""
        return self._operation_id

    @property
    def connection_id(self) -> str:
        """The channel connection of the operation."""
        return self._connection_id

    @property
    def next_seq(self) -> int:
        """The ``seq`` the next emitted record will carry."""
        return self._next_seq

    @property
    def state(self) -> str | None:
        """The state of the last published record (``None`` before the first)."""
        return self._state

    def envelope(
        self,
        state: str,
        *,
        reason: str | None = None,
        duplicate: bool | None = None,
        run_id: str | None = None,
        session_id: str | None = None,
        ts: datetime | str | None = None,
    ) -> dict[str, Any]:
        """The wire record the next ``emit(state, ...)`` would publish (consumes nothing)."""
        fields = dict(self._fields)
        if run_id is not None:
            fields["runId"] = run_id
        if session_id is not None:
            fields["sessionId"] = session_id
        record: dict[str, Any] = {
            "schema": CHANNEL_SCHEMA_ID,
            "eventId": new_event_id(),
            "operationId": self._operation_id,
            "seq": self._next_seq,
            "ts": timestamp(ts),
            "connectionId": self._connection_id,
            "kind": self._kind,
            "state": state,
            "reason": reason,
            "duplicate": duplicate,
            **fields,
        }
        return {k: v for k, v in record.items() if v is not None}

    def emit(
        self,
        state: str,
        *,
        reason: str | None = None,
        duplicate: bool | None = None,
        run_id: str | None = None,
        session_id: str | None = None,
        ts: datetime | str | None = None,
    ) -> PublishResult:
        """Publish the operation's next transition; returns at once (like ``RunEmitter.emit``).

        Raises ``InvalidEvent`` (and uses up no ``seq``) when the record breaks the
        contract, e.g. a state other than ``denied`` without an operation id.
        """
        record = self.envelope(
            state,
            reason=reason,
            duplicate=duplicate,
            run_id=run_id,
            session_id=session_id,
            ts=ts,
        )
        result = self._publisher.publish(record)
        self._next_seq += 1
        self._state = state
        if run_id is not None:
            self._fields["runId"] = run_id
        if session_id is not None:
            self._fields["sessionId"] = session_id
        return result

    def __repr__(self) -> str:
        return (
            f"ChannelEmitter(connection_id={self._connection_id!r}, "
            f"operation_id={self._operation_id!r}, next_seq={self._next_seq}, "
            f"state={self._state!r})"
        )
