"""The ``prism.channel-operation/v1`` family: one record per transition of a channel operation.

Messaging channels journal every inbound event as an *operation* (schemas/CONTRACT.md,
"Channel operations"); a runtime publishes each transition to ``prism.channel-operations``,
keyed by ``operationId`` (a denied admission has none and is keyed by ``connectionId``).

The legal transitions (``CHANNEL_TRANSITIONS``; the first state of an operation is a
transition from ``None``)::

    None -> admitted | denied | duplicate
    admitted -> executing
    executing -> delivered | notice_delivered | delivery_unknown | execution_unknown | cancelled
    delivery_unknown | execution_unknown -> reconciled

``denied`` and ``duplicate`` stand alone (one record, nothing before or after);
``delivered``, ``notice_delivered``, ``cancelled`` and ``reconciled`` are final.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal, get_args

from pydantic import Field, StringConstraints, model_validator
from pydantic.config import ConfigDict, JsonDict
from pydantic_core import PydanticCustomError

from prism.schemas._payloads import AgentRef
from prism.schemas._types import Id, Seq, Timestamp, Utf8MaxBytes, WireModel

__all__ = [
    "CHANNEL_FINAL_STATES",
    "CHANNEL_OPEN_STATES",
    "CHANNEL_SCHEMA_ID",
    "CHANNEL_TOPIC",
    "CHANNEL_TRANSITIONS",
    "ChannelKind",
    "ChannelOperation",
    "ChannelState",
    "is_legal_channel_transition",
]

CHANNEL_SCHEMA_ID: Final = "prism.channel-operation/v1"
"""The value of every channel-operation record's ``schema`` field."""

CHANNEL_TOPIC: Final = "prism.channel-operations"
"""The default topic of channel-operation records (the prefix is configurable)."""

ChannelKind = Literal["message", "command", "approval", "notify"]
ChannelState = Literal[
    "admitted",
    "executing",
    "delivered",
    "notice_delivered",
    "delivery_unknown",
    "execution_unknown",
    "cancelled",
    "reconciled",
    "denied",
    "duplicate",
]

CHANNEL_TRANSITIONS: Final[dict[str | None, frozenset[str]]] = {
    None: frozenset({"admitted", "denied", "duplicate"}),
    "admitted": frozenset({"executing"}),
    "executing": frozenset(
        {"delivered", "notice_delivered", "delivery_unknown", "execution_unknown", "cancelled"}
    ),
    "delivery_unknown": frozenset({"reconciled"}),
    "execution_unknown": frozenset({"reconciled"}),
    **{state: frozenset() for state in ("delivered", "notice_delivered", "cancelled")},
    **{state: frozenset() for state in ("reconciled", "denied", "duplicate")},
}
"""Legal next states of each state (``None``: the operation's first record)."""

CHANNEL_OPEN_STATES: Final = frozenset({"delivery_unknown", "execution_unknown"})
"""States that stay open items for on-call until a ``reconciled`` record follows."""

CHANNEL_FINAL_STATES: Final = frozenset(
    state for state, following in CHANNEL_TRANSITIONS.items() if state and not following
)
"""States nothing may follow."""

assert set(CHANNEL_TRANSITIONS) - {None} == set(get_args(ChannelState))

REASON_MAX_BYTES = 256

_RULES: JsonDict = {
    "allOf": [
        {
            "description": "operationId is required except on a denied admission.",
            "if": {"properties": {"state": {"not": {"const": "denied"}}}},
            "then": {
                "required": ["operationId"],
                "properties": {"operationId": {"type": "string"}},
            },
        },
        {
            "description": "A denied admission carries its reason.",
            "if": {"properties": {"state": {"const": "denied"}}, "required": ["state"]},
            "then": {"required": ["reason"], "properties": {"reason": {"type": "string"}}},
        },
    ]
}


def is_legal_channel_transition(previous: str | None, state: str) -> bool:
    """Whether an operation in ``previous`` (``None``: no record yet) may move to ``state``.

    >>> is_legal_channel_transition("executing", "delivery_unknown")
    True
    >>> is_legal_channel_transition("delivered", "executing")
    False
    """
    return state in CHANNEL_TRANSITIONS.get(previous, frozenset())


class ChannelOperation(WireModel):
    """One transition of a channel operation (``prism.channel-operation/v1``); no message text.

    >>> op = ChannelOperation.model_validate_json(
    ...     b'{"schema": "prism.channel-operation/v1", "eventId": "e1", "seq": 0,'
    ...     b' "ts": "2026-11-30T12:00:00Z", "connectionId": "telegram:main",'
    ...     b' "kind": "message", "state": "denied", "reason": "capacity"}')
    >>> op.state, op.operation_id
    ('denied', None)
    """

    model_config = ConfigDict(json_schema_extra=_RULES)

    schema_: Literal["prism.channel-operation/v1"] = Field(  # == CHANNEL_SCHEMA_ID
        validation_alias="schema", serialization_alias="schema"
    )
    """Always ``prism.channel-operation/v1``."""
    event_id: Id
    """Unique per record: the idempotency key (1..128 characters)."""
    operation_id: Id | None = None
    """The journaled operation; absent only on a ``denied`` admission."""
    seq: Seq
    """Transition order within the operation, from 0; at most 10,000,000."""
    ts: Timestamp
    """When the transition happened: RFC 3339 with seconds and an offset."""
    connection_id: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    """The channel connection, e.g. ``telegram:support-bot``."""
    kind: ChannelKind
    state: ChannelState
    reason: Annotated[str, Utf8MaxBytes(REASON_MAX_BYTES)] | None = None
    """Bounded reason of a denial, notice, cancellation or reconcile (``resent``...)."""
    duplicate: bool | None = None
    """True on an admitted transport re-delivery."""
    run_id: Id | None = None
    session_id: str | None = None
    tenant_id: str | None = None
    agent: AgentRef | None = None

    @model_validator(mode="after")
    def _denial_rules(self) -> ChannelOperation:
        if self.state != "denied" and self.operation_id is None:
            raise PydanticCustomError(
                "operation_id_missing",
                "operationId is required on every state but denied (state is {state})",
                {"field": "operationId", "state": self.state},
            )
        if self.state == "denied" and self.reason is None:
            raise PydanticCustomError(
                "denial_without_reason",
                "a denied admission needs its reason (capacity, unauthorized, ...)",
                {"field": "reason"},
            )
        return self

    @property
    def key(self) -> str:
        """The Kafka record key: ``operationId``, or ``connectionId`` for a denial without one."""
        return self.operation_id if self.operation_id is not None else self.connection_id
