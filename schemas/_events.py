"""The envelope, one event class per contract type, and the ``AgentEvent`` union.

``AgentEvent`` is discriminated on ``type`` by a callable: a type the contract does not
list parses into ``UnknownEvent``, which keeps its ``data`` as a raw dict (forward
compatibility). ``parse_event``/``parse_batch`` use a faster equivalent (see ``_parse``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Discriminator, Field, Tag, field_validator

from prism.schemas._data import (
    AgentDeniedData,
    AgentFinishedData,
    AgentStartedData,
    BudgetExhaustedData,
    ChildFailedData,
    ChildMilestoneData,
    DelegationChildEventsCappedData,
    DelegationChildEventsCoalescedData,
    DeterministicTurnFinishedData,
    ErrorEventData,
    ExtensionErrorData,
    GuardrailDeniedData,
    ProviderTurnFinishedData,
    RunLimitExceededData,
    RunResumedData,
    RunSuspendedData,
    ToolCallFinishedData,
    ToolNarrowingClampedData,
    UsageRecordedData,
)
from prism.schemas._payloads import AgentRef, ModelRef, ParentRef
from prism.schemas._types import BundleDigest, Id, JsonObject, Seq, Timestamp, WireModel

__all__ = [
    "KNOWN_EVENT_CLASSES",
    "KNOWN_EVENT_TYPES",
    "AgentDenied",
    "AgentEvent",
    "AgentFinished",
    "AgentStarted",
    "BudgetExhausted",
    "ChildFailed",
    "ChildMilestone",
    "DelegationChildEventsCapped",
    "DelegationChildEventsCoalesced",
    "DeterministicTurnFinished",
    "ErrorEvent",
    "EventBase",
    "ExtensionError",
    "GuardrailDenied",
    "KnownEvent",
    "ProviderTurnFinished",
    "RunLimitExceeded",
    "RunResumed",
    "RunSuspended",
    "ToolCallFinished",
    "ToolNarrowingClamped",
    "UnknownEvent",
    "UsageRecorded",
]


class EventBase(WireModel):
    """The envelope every event carries; subclasses fix ``type`` and type ``data``."""

    schema_: Literal["prism.agent-event/v1"] = Field(  # == SCHEMA_ID
        validation_alias="schema", serialization_alias="schema"
    )
    """Always ``prism.agent-event/v1``."""
    event_id: Id
    """Unique per event: the idempotency key (1..128 characters)."""
    run_id: Id
    """The run (1..128 characters); also the Kafka record key."""
    seq: Seq
    """Emission order within the run, from 0, never reused; at most 10,000,000."""
    type: str
    """The event type."""
    ts: Timestamp
    """Emission time: RFC 3339 with seconds and an offset."""
    session_id: str | None = None
    tenant_id: str | None = None
    """Ownership scope; billing and row-level access key on it."""
    account_id: str | None = None
    user_id: str | None = None
    agent: AgentRef | None = None
    model: ModelRef | None = None
    parent: ParentRef | None = None
    """Set on a child (delegated) run."""
    bundle_digest: BundleDigest | None = None
    """``snapshotRunBundle().digest`` of what ran: ``sha256:`` and 64 lowercase hex digits."""
    data: Any
    """The type's payload (an object; ``{}`` when there is none)."""


class AgentStarted(EventBase):
    type: Literal["agent_started"]
    data: AgentStartedData


class ProviderTurnFinished(EventBase):
    type: Literal["provider_turn_finished"]
    data: ProviderTurnFinishedData


class DeterministicTurnFinished(EventBase):
    type: Literal["deterministic_turn_finished"]
    data: DeterministicTurnFinishedData


class ToolCallFinished(EventBase):
    type: Literal["tool_call_finished"]
    data: ToolCallFinishedData


class ToolNarrowingClamped(EventBase):
    type: Literal["tool_narrowing_clamped"]
    data: ToolNarrowingClampedData


class RunSuspended(EventBase):
    type: Literal["run_suspended"]
    data: RunSuspendedData


class RunResumed(EventBase):
    type: Literal["run_resumed"]
    data: RunResumedData


class RunLimitExceeded(EventBase):
    type: Literal["run_limit_exceeded"]
    data: RunLimitExceededData


class BudgetExhausted(EventBase):
    type: Literal["budget_exhausted"]
    data: BudgetExhaustedData


class ChildMilestone(EventBase):
    type: Literal["child_milestone"]
    data: ChildMilestoneData


class ChildFailed(EventBase):
    type: Literal["child_failed"]
    data: ChildFailedData


class DelegationChildEventsCapped(EventBase):
    type: Literal["delegation_child_events_capped"]
    data: DelegationChildEventsCappedData


class DelegationChildEventsCoalesced(EventBase):
    type: Literal["delegation_child_events_coalesced"]
    data: DelegationChildEventsCoalescedData


class UsageRecorded(EventBase):
    type: Literal["usage_recorded"]
    data: UsageRecordedData


class ExtensionError(EventBase):
    type: Literal["extension_error"]
    data: ExtensionErrorData


class GuardrailDenied(EventBase):
    type: Literal["guardrail_denied"]
    data: GuardrailDeniedData


class AgentFinished(EventBase):
    type: Literal["agent_finished"]
    data: AgentFinishedData


class AgentDenied(EventBase):
    type: Literal["agent_denied"]
    data: AgentDeniedData


class ErrorEvent(EventBase):
    type: Literal["error"]
    data: ErrorEventData


KNOWN_EVENT_CLASSES: tuple[type[EventBase], ...] = (
    AgentStarted,
    ProviderTurnFinished,
    DeterministicTurnFinished,
    ToolCallFinished,
    ToolNarrowingClamped,
    RunSuspended,
    RunResumed,
    RunLimitExceeded,
    BudgetExhausted,
    ChildMilestone,
    ChildFailed,
    DelegationChildEventsCapped,
    DelegationChildEventsCoalesced,
    UsageRecorded,
    ExtensionError,
    GuardrailDenied,
    AgentFinished,
    AgentDenied,
    ErrorEvent,
)
"""Every event class of the contract, in schemas/CONTRACT.md order."""

KNOWN_EVENT_TYPES: frozenset[str] = frozenset(
    cls.model_fields["type"].annotation.__args__[0]  # type: ignore[union-attr]
    for cls in KNOWN_EVENT_CLASSES
)
"""The ``type`` values the contract lists; anything else parses into ``UnknownEvent``."""


class UnknownEvent(EventBase):
    """An event whose ``type`` the contract does not list: kept raw, affects no run state."""

    type: Annotated[str, Field(min_length=1)]
    data: JsonObject

    @field_validator("type")
    @classmethod
    def _not_a_known_type(cls, value: str) -> str:
        if value in KNOWN_EVENT_TYPES:
            raise ValueError(f"type {value!r} is a contract type; validate it as AgentEvent")
        return value


KnownEvent = Union[  # noqa: UP007 - a runtime union for pydantic
    AgentStarted,
    ProviderTurnFinished,
    DeterministicTurnFinished,
    ToolCallFinished,
    ToolNarrowingClamped,
    RunSuspended,
    RunResumed,
    RunLimitExceeded,
    BudgetExhausted,
    ChildMilestone,
    ChildFailed,
    DelegationChildEventsCapped,
    DelegationChildEventsCoalesced,
    UsageRecorded,
    ExtensionError,
    GuardrailDenied,
    AgentFinished,
    AgentDenied,
    ErrorEvent,
]
"""The contract's event classes (without ``UnknownEvent``)."""

_UNKNOWN_TAG = "__unknown__"


def _event_tag(value: Any) -> str | None:
    """Discriminator of ``AgentEvent``: the ``type`` when the contract lists it, else unknown."""
    if isinstance(value, dict):
        type_ = value.get("type")
    elif isinstance(value, EventBase):
        type_ = value.type
    else:
        return None  # not an object: pydantic reports it
    return type_ if isinstance(type_, str) and type_ in KNOWN_EVENT_TYPES else _UNKNOWN_TAG


AgentEvent = Annotated[
    Union[  # noqa: UP007 - a runtime union for pydantic
        Annotated[AgentStarted, Tag("agent_started")],
        Annotated[ProviderTurnFinished, Tag("provider_turn_finished")],
        Annotated[DeterministicTurnFinished, Tag("deterministic_turn_finished")],
        Annotated[ToolCallFinished, Tag("tool_call_finished")],
        Annotated[ToolNarrowingClamped, Tag("tool_narrowing_clamped")],
        Annotated[RunSuspended, Tag("run_suspended")],
        Annotated[RunResumed, Tag("run_resumed")],
        Annotated[RunLimitExceeded, Tag("run_limit_exceeded")],
        Annotated[BudgetExhausted, Tag("budget_exhausted")],
        Annotated[ChildMilestone, Tag("child_milestone")],
        Annotated[ChildFailed, Tag("child_failed")],
        Annotated[DelegationChildEventsCapped, Tag("delegation_child_events_capped")],
        Annotated[DelegationChildEventsCoalesced, Tag("delegation_child_events_coalesced")],
        Annotated[UsageRecorded, Tag("usage_recorded")],
        Annotated[ExtensionError, Tag("extension_error")],
        Annotated[GuardrailDenied, Tag("guardrail_denied")],
        Annotated[AgentFinished, Tag("agent_finished")],
        Annotated[AgentDenied, Tag("agent_denied")],
        Annotated[ErrorEvent, Tag("error")],
        Annotated[UnknownEvent, Tag(_UNKNOWN_TAG)],
    ],
    Discriminator(_event_tag),
]
"""Any event: a contract type's class, or ``UnknownEvent`` for types the contract omits."""
