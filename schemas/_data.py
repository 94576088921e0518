"""The ``data`` payload of each event type of the contract, one model per type."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, StringConstraints, model_validator
from pydantic.config import JsonDict
from pydantic_core import PydanticCustomError

from prism.schemas._payloads import (
    Breach,
    Budgets,
    CacheInfo,
    ClosestAxis,
    ErrorInfo,
    ToolsInfo,
    Usage,
)
from prism.schemas._types import (
    Count,
    Currency,
    Id,
    JsonObject,
    Middleware,
    NonNegNumber,
    Number,
    Ordinal,
    Utf8MaxBytes,
    WireModel,
)

__all__ = [
    "AgentDeniedData",
    "AgentFinishedData",
    "AgentStartedData",
    "BudgetExhaustedData",
    "ChildFailedData",
    "ChildMilestoneData",
    "DelegationChildEventsCappedData",
    "DelegationChildEventsCoalescedData",
    "DeterministicTurnFinishedData",
    "ErrorEventData",
    "ExtensionErrorData",
    "FinishStopReason",
    "GuardrailDeniedData",
    "GuardrailStage",
    "ProviderTurnFinishedData",
    "RunLimitExceededData",
    "RunResumedData",
    "RunSuspendedData",
    "ToolCallFinishedData",
    "ToolNarrowingClampedData",
    "TurnStopReason",
    "UsageRecordedData",
    "UsageScope",
]

TurnStopReason = Literal[
    "end_turn",
    "tool_calls",
    "max_output_tokens",
    "content_filter",
    "abort",
    "provider_error",
    "unknown",
]
FinishStopReason = Literal["host_policy", "turn_limit", "token_limit", "refusal"]
UsageScope = Literal["provider_turn", "run_total"]
GuardrailStage = Literal["before_tool", "after_tool", "input", "output"]

GUARDRAIL_RULE_PATTERN = r"^pack:[A-Za-z0-9._-]{1,64}/[A-Za-z0-9._:-]{1,128}$"

STOP_DETAIL_MAX_BYTES = 256
CLOSEST_MAX_ITEMS = 3
LAST_TOOL_CALL_HASHES_MAX_ITEMS = 10


class AgentStartedData(WireModel):
    """``agent_started``: the run began."""

    limits: JsonObject | None = None
    """The resolved run limits."""
    idempotency_key: str | None = None


class ProviderTurnFinishedData(WireModel):
    """``provider_turn_finished``: one attempt of a model turn completed."""

    turn: Ordinal
    """1-based turn number."""
    attempt: Ordinal
    """1-based provider attempt number within the turn."""
    latency_ms: NonNegNumber
    stop_reason: TurnStopReason
    budgets: Budgets
    tools: ToolsInfo
    cache: CacheInfo | None = None
    usage: Usage | None = None


class DeterministicTurnFinishedData(WireModel):
    """``deterministic_turn_finished``: a turn answered by middleware, without a model or usage."""

    turn: Ordinal
    middleware: Middleware
    """Id of the answering middleware: 1..64 characters of ``[A-Za-z0-9._:-]``."""


class ToolCallFinishedData(WireModel):
    """``tool_call_finished``: one tool call completed (arguments and results never appear)."""

    turn: Ordinal
    tool: str
    call_id_hash: str
    duration_ms: NonNegNumber
    ok: bool
    error_code: str | None = None


class ToolNarrowingClampedData(WireModel):
    """``tool_narrowing_clamped``: tools were dropped from a turn's menu."""

    turn: Ordinal
    dropped: list[str]
    """Names of the dropped tools."""


class RunSuspendedData(WireModel):
    """``run_suspended``: the run paused (e.g. awaiting approval)."""

    reason: str | None = None


class RunResumedData(WireModel):
    """``run_resumed``: a suspended run continued."""

    reason: str | None = None


class RunLimitExceededData(WireModel):
    """``run_limit_exceeded``: a run limit was breached (not terminal: an ``error`` follows)."""

    limit: str
    """The limit axis, e.g. ``maxTurns``, ``maxInputTokens``, ``maxWallMs``, ``maxCost``."""
    maximum: Number
    observed: Number
    currency: Currency | None = None


class BudgetExhaustedData(WireModel):
    """``budget_exhausted``: attribution of a limit death, just before the terminal ``error``."""

    axis: str
    counters: JsonObject
    """The run counters at exhaustion."""
    closest: Annotated[list[ClosestAxis], Field(max_length=CLOSEST_MAX_ITEMS)]
    """Up to three other axes closest to their limits."""
    last_tool_call_hashes: Annotated[list[str], Field(max_length=LAST_TOOL_CALL_HASHES_MAX_ITEMS)]
    """Hashes of up to the last ten dispatched tool calls."""


class ChildMilestoneData(WireModel):
    """``child_milestone``: a delegated child run reached a milestone."""

    delegation_id: str
    child_id: str
    child_run_id: Id | None = None
    turn: Ordinal | None = None


class ChildFailedData(WireModel):
    """``child_failed``: a delegated child run failed, possibly on a limit breach."""

    delegation_id: str
    child_id: str
    child_run_id: Id | None = None
    error: ErrorInfo
    breach: Breach | None = None


class DelegationChildEventsCappedData(WireModel):
    """``delegation_child_events_capped``: a child's forwarded events hit the cap."""

    delegation_id: str
    cap: Count


class DelegationChildEventsCoalescedData(WireModel):
    """``delegation_child_events_coalesced``: a child's forwarded events were coalesced."""

    delegation_id: str
    dropped: Count
    """How many child events were coalesced away."""


_SCOPE_RULES: JsonDict = {
    "allOf": [
        {
            "description": "provider_turn rows carry turn and attempt.",
            "if": {"properties": {"scope": {"const": "provider_turn"}}, "required": ["scope"]},
            "then": {
                "required": ["turn", "attempt"],
                "properties": {"turn": {"type": "integer"}, "attempt": {"type": "integer"}},
            },
        },
        {
            "description": "run_total rows carry neither turn nor attempt.",
            "if": {"properties": {"scope": {"const": "run_total"}}, "required": ["scope"]},
            "then": {"properties": {"turn": {"type": "null"}, "attempt": {"type": "null"}}},
        },
    ]
}


class UsageRecordedData(WireModel):
    """``usage_recorded``: one ledger usage row, per provider turn or for the whole run."""

    model_config = ConfigDict(json_schema_extra=_SCOPE_RULES)

    scope: UsageScope
    """``provider_turn`` rows are billable; ``run_total`` is the aggregate for presentation."""
    turn: Ordinal | None = None
    """Required for ``provider_turn``, absent for ``run_total``."""
    attempt: Ordinal | None = None
    """Required for ``provider_turn``, absent for ``run_total``."""
    entry_id: str | None = None
    usage: Usage

    @model_validator(mode="after")
    def _scope_rules(self) -> UsageRecordedData:
        if self.scope == "provider_turn":
            for name in ("turn", "attempt"):
                if getattr(self, name) is None:
                    raise PydanticCustomError(
                        "scope_field_missing",
                        "provider_turn usage needs turn and attempt; {name} is missing",
                        {"field": name, "name": name},
                    )
        else:
            for name in ("turn", "attempt"):
                value = getattr(self, name)
                if value is not None:
                    raise PydanticCustomError(
                        "scope_field_forbidden",
                        "run_total usage must not carry turn or attempt",
                        {"field": name, "value": value},
                    )
        return self


class ExtensionErrorData(WireModel):
    """``extension_error``: an extension failed (the run continues)."""

    extension: str
    code: str


class GuardrailDeniedData(WireModel):
    """``guardrail_denied``: a guardrail pack rule denied a step (never the denied content)."""

    turn: Ordinal | None = None
    tool: Annotated[str, StringConstraints(min_length=1, max_length=256)] | None = None
    """The tool whose call was denied, for the tool stages."""
    rule: Annotated[str, StringConstraints(pattern=GUARDRAIL_RULE_PATTERN)]
    """The denying rule as ``pack:<pack>/<rule>``, e.g. ``pack:secrets-hygiene/no-secret-args``."""
    stage: GuardrailStage
    """Where the guardrail ran: ``before_tool``, ``after_tool``, ``input`` or ``output``."""


class AgentFinishedData(WireModel):
    """``agent_finished`` (terminal): the run ended without an error."""

    finish_reason: str | None = None
    stop_reason: FinishStopReason | None = None
    """Why the loop stopped early; absent on a natural end."""
    stop_detail: Annotated[str, Utf8MaxBytes(STOP_DETAIL_MAX_BYTES)] | None = None
    """Host stop detail, at most 256 bytes of UTF-8."""


class AgentDeniedData(WireModel):
    """``agent_denied`` (terminal): the run was refused before it started."""

    reason: str


class ErrorEventData(WireModel):
    """``error`` (terminal): the run failed, or was aborted when ``aborted`` is true."""

    error: ErrorInfo
    aborted: bool | None = None
    abort_reason: str | None = None
