"""Shapes shared by several event types and the envelope: usage, errors, budgets, references."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, model_validator
from pydantic.config import JsonDict
from pydantic_core import PydanticCustomError

from prism.schemas._types import (
    Cost,
    Count,
    Currency,
    Id,
    Number,
    Ratio,
    SmallCount,
    Utf8MaxBytes,
    WireModel,
)

__all__ = [
    "AgentRef",
    "Breach",
    "Budgets",
    "CacheInfo",
    "ClosestAxis",
    "Confidence",
    "ErrorInfo",
    "FailureClass",
    "ModelRef",
    "ParentRef",
    "ToolsInfo",
    "Usage",
]

Confidence = Literal["medium", "low"]
FailureClass = Literal["quota", "auth", "rate_limited", "transient", "permanent", "unknown"]

ERROR_MESSAGE_MAX_BYTES = 1024

# JSON Schema forms of the cross-field rules ``Usage`` checks in Python.
_NULL: JsonDict = {"type": "null"}
_USAGE_RULES: JsonDict = {
    "allOf": [
        {
            "description": "Estimates are never priced: estimated usage carries no cost/currency.",
            "if": {"properties": {"estimated": {"const": True}}, "required": ["estimated"]},
            "then": {"properties": {"cost": _NULL, "currency": _NULL}},
        },
        {
            "description": "confidence is only allowed on an estimate (estimated: true).",
            "if": {"properties": {"confidence": {"not": _NULL}}, "required": ["confidence"]},
            "then": {"properties": {"estimated": {"const": True}}, "required": ["estimated"]},
        },
    ]
}


class Usage(WireModel):
    """Token counts and cost of one provider turn or of a whole run.

    Absent is not zero: a count the provider did not report stays absent, never 0.
    """

    model_config = ConfigDict(json_schema_extra=_USAGE_RULES)

    input_tokens: Count | None = None
    """All input tokens, cached ones included."""
    output_tokens: Count | None = None
    total_tokens: Count | None = None
    cache_read_tokens: Count | None = None
    cache_write_tokens: Count | None = None
    cost: Cost | None = None
    """Provider-reported price; never present on an estimate."""
    currency: Currency | None = None
    estimated: bool | None = None
    """True when the counts are a labeled estimate rather than a provider report."""
    confidence: Confidence | None = None
    """Confidence of an estimate; only with ``estimated: true``."""

    @model_validator(mode="after")
    def _estimates_are_never_priced(self) -> Usage:
        if self.estimated is True:
            if self.cost is not None or self.currency is not None:
                field, value = (
                    ("cost", format(self.cost, "f"))
                    if self.cost is not None
                    else ("currency", self.currency)
                )
                raise PydanticCustomError(
                    "priced_estimate",
                    "priced estimate: estimated usage must not carry cost/currency",
                    {"field": field, "value": value},
                )
        elif self.confidence is not None:
            raise PydanticCustomError(
                "confidence_without_estimate",
                "confidence is only allowed on an estimate (estimated: true), "
                "got estimated={estimated}",
                {
                    "field": "confidence",
                    "value": self.confidence,
                    "estimated": "absent" if self.estimated is None else "false",
                },
            )
        return self


class ErrorInfo(WireModel):
    """A redacted error: a stable code, a message of at most 1 KiB, an advisory class."""

    code: str
    message: Annotated[str, Utf8MaxBytes(ERROR_MESSAGE_MAX_BYTES)]
    """Already redacted by the producer; at most 1 KiB of UTF-8."""
    failure_class: FailureClass | None = None


class Budgets(WireModel):
    """The run's input-token and turn budgets as seen at the end of a provider turn."""

    input_tokens: Count | None = None
    input_cap: Count | None = None
    run_input_budget: Count | None = None
    run_input_used: Count
    turns: Count
    max_turns: Count


class ToolsInfo(WireModel):
    """The tool menu offered on a provider turn."""

    count: SmallCount
    ids_hash: str
    """Hash of the offered tool ids; identical menus keep the same hash."""


class CacheInfo(WireModel):
    """Provider-reported prompt-cache counts of a turn; absent when not reported."""

    cache_read_tokens: Count | None = None
    cache_write_tokens: Count | None = None
    hit_rate: Ratio | None = None


class Breach(WireModel):
    """A limit breach: which axis, its maximum and the observed value."""

    limit: str
    maximum: Number
    observed: Number


class ClosestAxis(WireModel):
    """One of the axes closest to its limit when a run's budget was exhausted."""

    axis: str
    used: Number
    maximum: Number


class AgentRef(WireModel):
    """The agent that ran."""

    id: str
    definition_revision: str | None = None


class ModelRef(WireModel):
    """The provider and model of the run."""

    provider: str
    model: str


class ParentRef(WireModel):
    """Set on a child (delegated) run: the parent run and the delegation."""

    run_id: Id
    delegation_id: str
    child_id: str | None = None
