"""Constants of the event contract (schemas/CONTRACT.md) and the one terminal-type predicate."""

from __future__ import annotations

from typing import Final

__all__ = [
    "MAX_EVENT_BYTES",
    "SCHEMA_ID",
    "TERMINAL_TYPES",
    "is_terminal_agent_event_type",
]

SCHEMA_ID: Final = "prism.agent-event/v1"
"""The value of every event's ``schema`` field."""

MAX_EVENT_BYTES = 1_048_576
"""Default maximum size of one record value (1 MiB); larger values are violations."""

TERMINAL_TYPES: frozenset[str] = frozenset({"agent_finished", "agent_denied", "error"})
"""The event types that end a run; ``run_limit_exceeded`` and ``budget_exhausted`` do not."""


def is_terminal_agent_event_type(type_: str) -> bool:
    """Whether an event of this type ends its run (the one predicate every module shares).

    >>> is_terminal_agent_event_type("error"), is_terminal_agent_event_type("run_limit_exceeded")
    (True, False)
    """
    return type_ in TERMINAL_TYPES
