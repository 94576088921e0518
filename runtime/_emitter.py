"""``RunEmitter``: one run's events with ``seq``, ``eventId``, ``ts`` and the envelope filled in."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from prism.schemas import SCHEMA_ID

from ._ids import new_event_id, utc_now_rfc3339

if TYPE_CHECKING:
    from ._base import Publisher, PublishResult

__all__ = ["RunEmitter", "timestamp", "wire_part"]


def wire_part(value: Any, what: str) -> Any:
    """A payload or envelope part in wire form: mappings as given, pydantic models by alias."""
    if value is None or isinstance(value, Mapping):
        return value
    if hasattr(value, "model_dump"):
        return value.model_dump(by_alias=True, exclude_none=True, mode="json")
    raise TypeError(
        f"{what} must be a mapping in wire form (camelCase keys) or a schemas model, "
        f"got {type(value).__name__}: {value!r}"
    )


def timestamp(value: datetime | str | None) -> str:
    """An emission time as RFC 3339 in UTC (now when ``None``; strings pass as given)."""
    if value is None:
        return utc_now_rfc3339()
    if isinstance(value, str):
        return value
    if value.tzinfo is None:
        raise ValueError(
            f"ts {value!r} has no timezone; pass an aware datetime (e.g. datetime.now(UTC))"
        )
    return value.astimezone(UTC).isoformat(timespec="microseconds")


class RunEmitter:
    """Emits the events of one run so that ``seq`` and ``eventId`` cannot be got wrong.

    ``seq`` starts at ``first_seq`` (0 for a new run), grows by one per published event and
    is never reused; an event the publisher rejects as invalid or oversize does not use up
    a ``seq``, while one dropped for a full buffer does (the pipeline records the gap).
    ``eventId`` is a UUIDv7 (unique, time-ordered) and ``ts`` the emission time in UTC.

    Example::

        run = publisher.run("run-42", tenant_id="acme", agent="support-bot",
                            model={"provider": "anthropic", "model": "claude-sonnet-4"})
        run.emit("agent_started", {})
        run.emit("provider_turn_finished", {"turn": 1, ...})
        await run.emit("agent_finished", {"finishReason": "stop"})
    """

    def __init__(
        self,
        publisher: Publisher,
        run_id: str,
        *,
        tenant_id: str | None = None,
        account_id: str | None = None,
        user_id: str | None = None,
        session_id: str | None = None,
        agent: str | Mapping[str, Any] | Any = None,
        model: Mapping[str, Any] | Any = None,
        parent: Mapping[str, Any] | Any = None,
        bundle_digest: str | None = None,
        first_seq: int = 0,
    ) -> None:
        if not isinstance(run_id, str) or not run_id:
            raise ValueError(f"run_id must be a non-empty string, got {run_id!r}")
        if first_seq < 0:
            raise ValueError(f"first_seq must be >= 0, got {first_seq!r}")
        self._publisher = publisher
        self._run_id = run_id
        self._next_seq = first_seq
        self._fields = {
            "tenant_id": tenant_id,
            "account_id": account_id,
            "user_id": user_id,
            "session_id": session_id,
            "agent": agent,
            "model": model,
            "bundle_digest": bundle_digest,
        }
        extras: dict[str, Any] = {
            "sessionId": session_id,
            "tenantId": tenant_id,
            "accountId": account_id,
            "userId": user_id,
            "agent": {"id": agent} if isinstance(agent, str) else wire_part(agent, "agent"),
            "model": wire_part(model, "model"),
            "parent": wire_part(parent, "parent"),
            "bundleDigest": bundle_digest,
        }
        self._extras = {k: v for k, v in extras.items() if v is not None}

    @property
    def run_id(self) -> str:
        """The run every event of this emitter belongs to."""
        return self._run_id

    @property
    def next_seq(self) -> int:
        """The ``seq`` the next emitted event will carry."""
        return self._next_seq

    def envelope(
        self, type_: str, data: Mapping[str, Any] | Any = None, *, ts: datetime | str | None = None
    ) -> dict[str, Any]:
        """The wire envelope the next ``emit(type_, data)`` would publish (consumes nothing)."""
        payload = wire_part(data, "data")
        return {
            "schema": SCHEMA_ID,
            "eventId": new_event_id(),
            "runId": self._run_id,
            "seq": self._next_seq,
            "type": type_,
            "ts": timestamp(ts),
            **self._extras,
            "data": {} if payload is None else payload,
        }

    def emit(
        self, type_: str, data: Mapping[str, Any] | Any = None, *, ts: datetime | str | None = None
    ) -> PublishResult:
        """Publish the run's next event; returns at once (await the result to wait for room).

        Raises ``InvalidEvent`` or ``EventTooLarge`` (and uses up no ``seq``) when the
        event breaks the contract or the size limit.
        """
        result = self._publisher.publish(self.envelope(type_, data, ts=ts))
        self._next_seq += 1
        return result

    def guardrail_denied(
        self,
        rule: str,
        stage: str,
        *,
        turn: int | None = None,
        tool: str | None = None,
        ts: datetime | str | None = None,
    ) -> PublishResult:
        """Publish a ``guardrail_denied`` event: which pack rule denied what, never the content.

        ``rule`` is ``pack:<pack>/<rule>``; ``stage`` one of ``before_tool``, ``after_tool``,
        ``input``, ``output``. Example::

            run.guardrail_denied("pack:secrets-hygiene/no-secret-args", "before_tool",
                                 turn=3, tool="http.fetch")
        """
        data: dict[str, Any] = {"rule": rule, "stage": stage}
        if turn is not None:
            data["turn"] = turn
        if tool is not None:
            data["tool"] = tool
        return self.emit("guardrail_denied", data, ts=ts)

    def child(
        self, run_id: str, *, delegation_id: str, child_id: str | None = None, **overrides: Any
    ) -> RunEmitter:
        """An emitter for a delegated child run: same ownership, ``parent`` set to this run."""
        parent = {"runId": self._run_id, "delegationId": delegation_id}
        if child_id is not None:
            parent["childId"] = child_id
        fields = {**self._fields, **overrides}
        return RunEmitter(self._publisher, run_id, parent=parent, **fields)

    def __repr__(self) -> str:
        return f"RunEmitter(run_id={self._run_id!r}, next_seq={self._next_seq})"
