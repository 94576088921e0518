"""The wire contract (schemas/CONTRACT.md) in pydantic v2, and the ledger rows.

Two families: agent events (``prism.agent-event/v1``, ``AgentEvent``) and channel
operations (``prism.channel-operation/v1``, ``ChannelOperation``). Every package may
import ``schemas``; it imports no other package of the project.

Parse record values with ``parse_batch`` (one result per value, in order) or
``parse_event``; ``parse_channel_batch`` / ``parse_channel_operation`` do the same for
channel operations and ``parse_any_batch`` takes both, dispatching on ``schema``. An
invalid value is a ``ContractViolation`` (the package's one exception, a ``ValueError``)
whose ``code`` is ``unparsable``, ``oversized`` or ``contract_violation`` and whose
``reason`` names the field path and the value:

    >>> from prism.schemas import ContractViolation, parse_batch
    >>> [r.code for r in parse_batch([b"{}", b"[]"]) if isinstance(r, ContractViolation)]
    ['contract_violation', 'unparsable']

``parse_fast_batch`` is the intake's faster equivalent: msgspec decodes what it is sure
of into a ``FastEvent`` (payload and envelope already in wire form) and every other
value gets exactly ``parse_batch``'s result.

Python attributes are snake_case; the wire form (``event_to_wire``) is camelCase. Event
types the contract does not list parse into ``UnknownEvent``; ``is_terminal_agent_event_type``
is the one terminal predicate. ``dead_letter_preview`` and ``redact_unknown_data`` keep
content sent by mistake (prompts, tool arguments and results, secrets) out of the ledger.
"""

# First: ``_fast`` may come from the mypyc build (``make compile``; PRISM_CORE chooses).
from prism.schemas._compiled import use_compiled as _use_compiled

COMPILED = _use_compiled(__path__, __name__)  # True: the mypyc build runs

from prism.schemas._channel import (
    CHANNEL_FINAL_STATES,
    CHANNEL_OPEN_STATES,
    CHANNEL_SCHEMA_ID,
    CHANNEL_TOPIC,
    CHANNEL_TRANSITIONS,
    ChannelKind,
    ChannelOperation,
    ChannelState,
    is_legal_channel_transition,
)
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
    GuardrailDeniedData,
    GuardrailStage,
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
    GuardrailDenied,
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
from prism.schemas._fast import FastEvent, parse_fast_batch
from prism.schemas._json_schema import (
    CHANNEL_JSON_SCHEMA_ID,
    CHANNEL_JSON_SCHEMA_PATH,
    EVENT_JSON_SCHEMA_ID,
    EVENT_JSON_SCHEMA_PATH,
    JSON_SCHEMA_FILES,
    channel_json_schema,
    event_json_schema,
    render_channel_json_schema,
    render_event_json_schema,
)
from prism.schemas._ledger import (
    AlertRow,
    ChannelDenialRow,
    ChannelOperationRow,
    ChannelQuarantineRow,
    ChannelWatermarkRow,
    DeadLetterRow,
    LedgerBatch,
    ProgressRow,
    QuarantineRow,
    RawEventRow,
    RunRow,
    TurnRow,
    UsageRow,
)
from prism.schemas._parse import (
    RawValue,
    event_to_wire,
    parse_any_batch,
    parse_batch,
    parse_channel_batch,
    parse_channel_operation,
    parse_event,
)
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
from prism.schemas._redact import (
    DEFAULT_DENY,
    DeadLetterPreview,
    dead_letter_preview,
    deny_list,
    is_denied_key,
    mask_secrets,
    redact_unknown_data,
)
from prism.schemas._types import (
    COST_MAX_DECIMALS,
    MAX_COST,
    MAX_SAFE_INTEGER,
    MAX_SEQ,
    MAX_UINT32,
    TS_MAX,
    TS_MIN,
)

__all__ = [
    "CHANNEL_FINAL_STATES",
    "CHANNEL_JSON_SCHEMA_ID",
    "CHANNEL_JSON_SCHEMA_PATH",
    "CHANNEL_OPEN_STATES",
    "CHANNEL_SCHEMA_ID",
    "CHANNEL_TOPIC",
    "CHANNEL_TRANSITIONS",
    "COMPILED",
    "COST_MAX_DECIMALS",
    "DEFAULT_DENY",
    "EVENT_JSON_SCHEMA_ID",
    "EVENT_JSON_SCHEMA_PATH",
    "JSON_SCHEMA_FILES",
    "KNOWN_EVENT_CLASSES",
    "KNOWN_EVENT_TYPES",
    "MAX_COST",
    "MAX_EVENT_BYTES",
    "MAX_SAFE_INTEGER",
    "MAX_SEQ",
    "MAX_UINT32",
    "SCHEMA_ID",
    "TERMINAL_TYPES",
    "TS_MAX",
    "TS_MIN",
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
    "ChannelDenialRow",
    "ChannelKind",
    "ChannelOperation",
    "ChannelOperationRow",
    "ChannelQuarantineRow",
    "ChannelState",
    "ChannelWatermarkRow",
    "ChildFailed",
    "ChildFailedData",
    "ChildMilestone",
    "ChildMilestoneData",
    "ClosestAxis",
    "ContractViolation",
    "DeadLetterPreview",
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
    "FastEvent",
    "GuardrailDenied",
    "GuardrailDeniedData",
    "GuardrailStage",
    "KnownEvent",
    "LedgerBatch",
    "ModelRef",
    "ParentRef",
    "ProgressRow",
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
    "channel_json_schema",
    "dead_letter_preview",
    "deny_list",
    "event_json_schema",
    "event_to_wire",
    "is_denied_key",
    "is_legal_channel_transition",
    "is_terminal_agent_event_type",
    "mask_secrets",
    "parse_any_batch",
    "parse_batch",
    "parse_channel_batch",
    "parse_channel_operation",
    "parse_event",
    "parse_fast_batch",
    "redact_unknown_data",
    "render_channel_json_schema",
    "render_event_json_schema",
]
