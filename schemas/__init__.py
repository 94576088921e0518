"""The ``prism.agent-event/v1`` wire contract (CONTRACT.md) in pydantic v2, and the ledger rows.

Every package may import ``schemas``; it imports no other package of the project.

Parse record values with ``parse_batch`` (one result per value, in order) or
``parse_event``. An invalid value is a ``ContractViolation`` (the package's one
exception, a ``ValueError``) whose ``code`` is ``unparsable``, ``oversized`` or
``contract_violation`` and whose ``reason`` names the field path and the value:

    >>> from prism.schemas import ContractViolation, parse_batch
    >>> [r.code for r in parse_batch([b"{}", b"[]"]) if isinstance(r, ContractViolation)]
    ['contract_violation', 'unparsable']

Python attributes are snake_case; the wire form (``event_to_wire``) is camelCase. Event
types the contract does not list parse into ``UnknownEvent``; ``is_terminal_agent_event_type``
is the one terminal predicate.
"""

from prism.schemas._constants import (
    MAX_EVENT_BYTES,
    SCHEMA_ID,
    TERMINAL_TYPES,
    is_terminal_agent_event_type,
)
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
    ProviderTurnFinishedData,
    RunLimitExceededData,
    RunResumedData,
    RunSuspendedData,
    ToolCallFinishedData,
    ToolNarrowingClampedData,
    UsageRecordedData,
)
from prism.schemas._errors import ContractViolation, ViolationCode
from prism.schemas._events import (
    KNOWN_EVENT_CLASSES,
    KNOWN_EVENT_TYPES,
    AgentDenied,
    AgentEvent,
    AgentFinished,
    AgentStarted,
    BudgetExhausted,
    ChildFailed,
    ChildMilestone,
    DelegationChildEventsCapped,
    DelegationChildEventsCoalesced,
    DeterministicTurnFinished,
    ErrorEvent,
    EventBase,
    ExtensionError,
    KnownEvent,
    ProviderTurnFinished,
    RunLimitExceeded,
    RunResumed,
    RunSuspended,
    ToolCallFinished,
    ToolNarrowingClamped,
    UnknownEvent,
    UsageRecorded,
)
from prism.schemas._json_schema import (
    EVENT_JSON_SCHEMA_ID,
    EVENT_JSON_SCHEMA_PATH,
    event_json_schema,
    render_event_json_schema,
)
from prism.schemas._ledger import (
    AlertRow,
    DeadLetterRow,
    LedgerBatch,
    QuarantineRow,
    RawEventRow,
    RunRow,
    TurnRow,
    UsageRow,
)
from prism.schemas._parse import RawValue, event_to_wire, parse_batch, parse_event
from prism.schemas._payloads import (
    AgentRef,
    Breach,
    Budgets,
    CacheInfo,
    ClosestAxis,
    ErrorInfo,
    ModelRef,
    ParentRef,
    ToolsInfo,
    Usage,
)

__all__ = [
    "EVENT_JSON_SCHEMA_ID",
    "EVENT_JSON_SCHEMA_PATH",
    "KNOWN_EVENT_CLASSES",
    "KNOWN_EVENT_TYPES",
    "MAX_EVENT_BYTES",
    "SCHEMA_ID",
    "TERMINAL_TYPES",
    "AgentDenied",
    "AgentDeniedData",
    "AgentEvent",
    "AgentFinished",
    "AgentFinishedData",
    "AgentRef",
    "AgentStarted",
    "AgentStartedData",
    "AlertRow",
    "Breach",
    "BudgetExhausted",
    "BudgetExhaustedData",
    "Budgets",
    "CacheInfo",
    "ChildFailed",
    "ChildFailedData",
    "ChildMilestone",
    "ChildMilestoneData",
    "ClosestAxis",
    "ContractViolation",
    "DeadLetterRow",
    "DelegationChildEventsCapped",
    "DelegationChildEventsCappedData",
    "DelegationChildEventsCoalesced",
    "DelegationChildEventsCoalescedData",
    "DeterministicTurnFinished",
    "DeterministicTurnFinishedData",
    "ErrorEvent",
    "ErrorEventData",
    "ErrorInfo",
    "EventBase",
    "ExtensionError",
    "ExtensionErrorData",
    "KnownEvent",
    "LedgerBatch",
    "ModelRef",
    "ParentRef",
    "ProviderTurnFinished",
    "ProviderTurnFinishedData",
    "QuarantineRow",
    "RawEventRow",
    "RawValue",
    "RunLimitExceeded",
    "RunLimitExceededData",
    "RunResumed",
    "RunResumedData",
    "RunRow",
    "RunSuspended",
    "RunSuspendedData",
    "ToolCallFinished",
    "ToolCallFinishedData",
    "ToolNarrowingClamped",
    "ToolNarrowingClampedData",
    "ToolsInfo",
    "TurnRow",
    "UnknownEvent",
    "Usage",
    "UsageRecorded",
    "UsageRecordedData",
    "UsageRow",
    "ViolationCode",
    "event_json_schema",
    "event_to_wire",
    "is_terminal_agent_event_type",
    "parse_batch",
    "parse_event",
    "render_event_json_schema",
]
