"""``ContractViolation`` (the package's one exception) and the one-line reasons it carries.

Hierarchy::

    ValueError
    └── ContractViolation          .code in {"unparsable", "contract_violation", "oversized"}

A reason names the field path(s) on the wire (camelCase) and the offending value, e.g.
``data.usage.cost: priced estimate: estimated usage must not carry cost/currency
(cost='0.12')``, so a dead-letter record explains itself.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ValidationError

__all__ = ["ContractViolation", "ViolationCode", "reason_from_validation_error"]

ViolationCode = Literal["unparsable", "contract_violation", "oversized"]

MAX_VALUE_CHARS = 80
MAX_REPORTED_ERRORS = 3

# Readable descriptions of pattern-checked fields, keyed by the last wire path element.
_EXPECTED = {
    "ts": "an RFC 3339 timestamp with seconds and an offset, e.g. '2025-01-31T12:00:00Z'",
    "bundleDigest": "'sha256:' followed by 64 lowercase hex digits",
    "middleware": "1..64 characters of [A-Za-z0-9._:-]",
    "currency": "an ISO 4217 code of three capital letters, e.g. 'USD'",
    "rule": "'pack:<pack>/<rule>', e.g. 'pack:secrets-hygiene/no-secret-args'",
}
_DESCRIBED = {"string_pattern_mismatch", "string_type"}


class ContractViolation(ValueError):
    """A record value that is not a valid ``prism.agent-event/v1`` event.

    ``code`` says which kind (``unparsable``: not UTF-8, not JSON or not a JSON object;
    ``oversized``: over the size limit; ``contract_violation``: everything else) and
    ``reason`` is one line naming the field path and the offending value. Fix the
    producer to follow schemas/CONTRACT.md; the pipeline routes such records to the DLQ.

    >>> ContractViolation("oversized", "value is 2000000 bytes").code
    'oversized'
    """

    def __init__(self, code: ViolationCode, reason: str) -> None:
        super().__init__(reason)
        self.code: ViolationCode = code
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.code, self.reason))

    def __repr__(self) -> str:
        return f"ContractViolation(code={self.code!r}, reason={self.reason!r})"


def short_repr(value: Any, limit: int = MAX_VALUE_CHARS) -> str:
    """``repr`` of a value cut to ``limit`` characters, on one line (huge integers included)."""
    if type(value) is int and value.bit_length() > 4 * limit:
        # Never build the decimal string of a huge integer (slow, and capped by Python).
        digits = int(value.bit_length() * 0.30103) + 1
        return f"{'-' if value < 0 else ''}<an integer of about {digits} digits>"
    try:
        text = repr(value)
    except ValueError:  # an object whose repr needs a too-long integer string
        text = f"<{type(value).__name__} too large to show>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out or "(event)"


def _describe(error: Any) -> str:
    """One error of a ``ValidationError`` as ``path: message (name=value)``."""
    loc = tuple(error["loc"])
    ctx = error.get("ctx") or {}
    kind = error["type"]
    message = error["msg"]
    if "field" in ctx:  # a cross-field rule checked on the parent model
        loc = (*loc, ctx["field"])
    name = loc[-1] if loc and isinstance(loc[-1], str) else "value"
    if kind in _DESCRIBED and name in _EXPECTED:
        message = f"should be {_EXPECTED[name]}"
    elif kind == "missing":
        return f"{_path(loc)}: missing required field"
    if "field" in ctx:
        if "value" not in ctx:
            return f"{_path(loc)}: {message}"
        value = ctx["value"]
    elif "shown" in ctx:  # a checked value shown in its wire form (e.g. ts, cost)
        value = ctx["shown"]
    else:
        value = error.get("input")
    return f"{_path(loc)}: {message} ({name}={short_repr(value)})"


def reason_from_validation_error(exc: ValidationError, *, strip_tag: bool = False) -> str:
    """Condense a pydantic ``ValidationError`` into one reason line.

    ``strip_tag`` drops the first location element (the union's tag: the event type).
    """
    errors = exc.errors(include_url=False)
    parts = []
    for error in errors[:MAX_REPORTED_ERRORS]:
        if strip_tag and error["loc"]:
            error = {**error, "loc": error["loc"][1:]}
        parts.append(_describe(error))
    if len(errors) > MAX_REPORTED_ERRORS:
        parts.append(f"and {len(errors) - MAX_REPORTED_ERRORS} more")
    return "; ".join(parts)
