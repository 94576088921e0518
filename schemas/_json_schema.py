"""The contract as JSON Schemas (Draft 2020-12) that runtimes in any language can validate against.

Two committed files, one per family. Agent events: the envelope's properties at the top
level (``type`` any non-empty string, ``data`` any object), plus one ``if type == X then
data matches XData`` rule per contract type, so known types are validated strictly and
unknown types still validate (forward compatible). Channel operations: one flat object.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, cast

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from prism.schemas._channel import CHANNEL_SCHEMA_ID, CHANNEL_TRANSITIONS, ChannelOperation
from prism.schemas._constants import SCHEMA_ID, TERMINAL_TYPES
from prism.schemas._events import KNOWN_EVENT_CLASSES, UnknownEvent

__all__ = [
    "CHANNEL_JSON_SCHEMA_ID",
    "CHANNEL_JSON_SCHEMA_PATH",
    "EVENT_JSON_SCHEMA_ID",
    "EVENT_JSON_SCHEMA_PATH",
    "JSON_SCHEMA_FILES",
    "channel_json_schema",
    "event_json_schema",
    "render_channel_json_schema",
    "render_event_json_schema",
]

EVENT_JSON_SCHEMA_ID = "urn:prism:schema:prism.agent-event:v1"
EVENT_JSON_SCHEMA_PATH = Path(__file__).with_name("prism-agent-event.v1.schema.json")
"""The committed agent-event schema file (``prism-pipeline schema export`` writes it)."""

CHANNEL_JSON_SCHEMA_ID = "urn:prism:schema:prism.channel-operation:v1"
CHANNEL_JSON_SCHEMA_PATH = Path(__file__).with_name("prism-channel-operation.v1.schema.json")
"""The committed channel-operation schema file, beside the agent-event one."""

_DESCRIPTION = (
    f"One record value of the Prism agent-event topic ({SCHEMA_ID}). The envelope is "
    "validated for every event; `data` is validated by the rules of its `type`. Types not "
    "listed here are accepted with any object `data` (forward compatible; they do not "
    "affect run state). Unknown fields are allowed and ignored. Terminal types: "
    f"{', '.join(sorted(TERMINAL_TYPES))}. Rules a JSON Schema cannot express (byte "
    "lengths of stopDetail and error messages, the decimal places of a cost given as a "
    "number, the exact ts range under an offset, integer ranges inside free-form objects) "
    "are checked by the pipeline."
)
_CHANNEL_DESCRIPTION = (
    f"One record value of the Prism channel-operation topic ({CHANNEL_SCHEMA_ID}): one "
    "transition of a messaging-channel operation, keyed by operationId (by connectionId for "
    "a denied admission, which has no operationId). Never carries message text. Legal "
    "transitions: "
    + "; ".join(
        f"{state or '(first record)'} -> {' | '.join(sorted(following))}"
        for state, following in CHANNEL_TRANSITIONS.items()
        if following
    )
    + ". Others are quarantined by the pipeline (illegal_transition)."
)


def _tidy(node: Any, *, is_property: bool = False) -> Any:
    """Drop pydantic's generated property titles and Python markup from descriptions."""
    if isinstance(node, list):
        return [_tidy(item) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "title" and is_property:
            continue
        if key == "description" and isinstance(value, str):
            out[key] = value.replace("``", "`")
        elif key == "properties" and isinstance(value, dict):
            out[key] = {name: _tidy(sub, is_property=True) for name, sub in value.items()}
        else:
            out[key] = _tidy(value)
    return out


def _type_of(cls: type) -> str:
    return str(cls.model_fields["type"].annotation.__args__[0])  # type: ignore[attr-defined]


def event_json_schema() -> dict[str, Any]:
    """Build the Draft 2020-12 JSON Schema of one event (envelope + per-type ``data``).

    >>> event_json_schema()["$schema"]
    'https://json-schema.org/draft/2020-12/schema'
    """
    data_models = [
        cast(type[BaseModel], cls.model_fields["data"].annotation) for cls in KNOWN_EVENT_CLASSES
    ]
    mode: Literal["validation"] = "validation"
    refs, defs = models_json_schema(
        [(m, mode) for m in [cast(type[BaseModel], UnknownEvent), *data_models]],
        by_alias=True,
        ref_template="#/$defs/{model}",
    )
    all_defs: dict[str, Any] = dict(defs["$defs"])
    envelope = all_defs.pop("UnknownEvent")
    properties = dict(envelope["properties"])
    properties["type"] = {
        "type": "string",
        "minLength": 1,
        "description": "The event type: one of the contract's types, or any other (kept raw).",
    }
    properties["data"] = {
        "type": "object",
        "description": "The type's payload (an object; {} when there is none).",
    }
    rules = []
    for cls, model in zip(KNOWN_EVENT_CLASSES, data_models, strict=True):
        rules.append(
            {
                "if": {"properties": {"type": {"const": _type_of(cls)}}, "required": ["type"]},
                "then": {"properties": {"data": refs[(model, mode)]}},
            }
        )
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": EVENT_JSON_SCHEMA_ID,
        "title": f"Prism agent event ({SCHEMA_ID})",
        "description": _DESCRIPTION,
        "type": "object",
        "properties": properties,
        "required": envelope["required"],
        "allOf": rules,
        "$defs": dict(sorted(all_defs.items())),
    }
    return _tidy(schema)  # type: ignore[no-any-return]


def channel_json_schema() -> dict[str, Any]:
    """Build the Draft 2020-12 JSON Schema of one channel-operation record.

    >>> channel_json_schema()["properties"]["schema"]["const"]
    'prism.channel-operation/v1'
    """
    mode: Literal["validation"] = "validation"
    _, defs = models_json_schema(
        [(cast(type[BaseModel], ChannelOperation), mode)],
        by_alias=True,
        ref_template="#/$defs/{model}",
    )
    all_defs: dict[str, Any] = dict(defs["$defs"])
    record = all_defs.pop("ChannelOperation")
    record.pop("title", None)
    record.pop("description", None)
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": CHANNEL_JSON_SCHEMA_ID,
        "title": f"Prism channel operation ({CHANNEL_SCHEMA_ID})",
        "description": _CHANNEL_DESCRIPTION,
        **record,
        "$defs": dict(sorted(all_defs.items())),
    }
    return _tidy(schema)  # type: ignore[no-any-return]


def _render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def render_event_json_schema() -> str:
    """The exact text of the committed agent-event schema file (stable keys, final newline)."""
    return _render(event_json_schema())


def render_channel_json_schema() -> str:
    """The exact text of the committed channel-operation schema file."""
    return _render(channel_json_schema())


JSON_SCHEMA_FILES: dict[str, tuple[Path, Callable[[], str]]] = {
    "agent-event": (EVENT_JSON_SCHEMA_PATH, render_event_json_schema),
    "channel-operation": (CHANNEL_JSON_SCHEMA_PATH, render_channel_json_schema),
}
"""Every committed schema file: family -> (default path, renderer of its exact text)."""
