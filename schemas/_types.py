"""Field types shared by the contract models: ids, timestamps, counts, cost, byte-capped text.

Every type validates in pydantic-core (no Python call) where the rule allows it, and
carries the JSON Schema that expresses the same rule for non-Python runtimes.

Bounded values (schemas/CONTRACT.md rule 13) keep every accepted value storable in the
ledger's columns, so a hostile number is a contract violation (DLQ) instead of an insert
that fails forever or a serialiser that crashes:

- ``seq``: 0..10,000,000 (``Seq``).
- token counts, budgets, caps, dropped counts: integers in 0..2^53-1 (``Count``; Int64).
- ``turn``, ``attempt``: 1..2^32-1 and ``tools.count``: 0..2^32-1 (``Ordinal``,
  ``SmallCount``; UInt32 columns), all inside 0..2^53-1.
- durations (``latencyMs``, ``durationMs``): finite numbers in 0..2^53-1 (``NonNegNumber``);
  limit values (``maximum``, ``observed``, ``used``): finite numbers (``Number``; Float64).
- ``cost``: >= 0 and < 10^15 with at most 12 decimal places (``Cost``; Decimal(38, 12)).
- ``ts``: within [1970-01-01, 2200-01-01) UTC (``Timestamp``; DateTime64(3)).
- free-form objects (``limits``, ``counters``, unknown types' ``data``): integers within
  +-(2^53-1) and finite numbers only (``JsonObject``), so they always serialise to JSON.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from decimal import Decimal
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    StringConstraints,
)
from pydantic.alias_generators import to_camel
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema

__all__ = [
    "BUNDLE_DIGEST_PATTERN",
    "COST_MAX_DECIMALS",
    "COST_PATTERN",
    "CURRENCY_PATTERN",
    "MAX_COST",
    "MAX_SAFE_INTEGER",
    "MAX_SEQ",
    "MAX_UINT32",
    "MIDDLEWARE_PATTERN",
    "RFC3339_PATTERN",
    "TS_MAX",
    "TS_MIN",
    "BundleDigest",
    "Cost",
    "Count",
    "Currency",
    "Id",
    "JsonObject",
    "Middleware",
    "NonNegNumber",
    "Number",
    "Ordinal",
    "Ratio",
    "Seq",
    "SmallCount",
    "Timestamp",
    "Utf8MaxBytes",
    "WireModel",
]

RFC3339_PATTERN = (
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?"
    r"([Zz]|[+-][0-9]{2}:[0-9]{2})$"
)
BUNDLE_DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"
MIDDLEWARE_PATTERN = r"^[A-Za-z0-9._:-]{1,64}$"
CURRENCY_PATTERN = r"^[A-Z]{3}$"
MAX_SEQ = 10_000_000
"""The largest ``seq`` the contract accepts (rule 13)."""
MAX_SAFE_INTEGER = 2**53 - 1
"""The largest token count (and any other stored integer): exact in every JSON parser."""
MAX_UINT32 = 2**32 - 1
"""The largest ``turn``, ``attempt`` and ``tools.count`` (UInt32 ledger columns)."""
MAX_COST = Decimal(10) ** 15
"""Costs are strictly below this (rule 13)."""
COST_MAX_DECIMALS = 12
"""Costs carry at most this many decimal places (the ledger's Decimal(38, 12))."""
TS_MIN = datetime(1970, 1, 1, tzinfo=UTC)
"""The earliest accepted ``ts`` (inclusive)."""
TS_MAX = datetime(2200, 1, 1, tzinfo=UTC)
"""The first ``ts`` no longer accepted (exclusive)."""
# At most 15 integer digits (leading zeros aside) and 12 decimals (trailing zeros aside).
COST_PATTERN = r"^0*[0-9]{1,15}(\.[0-9]{1,12}0*)?$"
# RFC3339_PATTERN restricted to the years 1970..2199 (the JSON Schema form of the ts range).
_TS_JSON_PATTERN = "^(19[7-9][0-9]|2[01][0-9]{2})" + RFC3339_PATTERN[len("^[0-9]{4}") :]


class WireModel(BaseModel):
    """Base of every contract model: camelCase on the wire, strict types, frozen, lenient on extras.

    Unknown keys are ignored so that producers can add fields without breaking consumers.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="ignore",
        frozen=True,
        strict=True,
        allow_inf_nan=False,
        use_attribute_docstrings=True,
    )


Id = Annotated[str, StringConstraints(min_length=1, max_length=128)]
"""An identifier of 1..128 characters (event ids, run ids)."""

Seq = Annotated[int, Field(ge=0, le=MAX_SEQ)]
"""An emission order number: an integer in 0..10,000,000."""

Count = Annotated[int, Field(ge=0, le=MAX_SAFE_INTEGER)]
"""A non-negative integer up to 2^53-1: token counts, budgets, caps, dropped counts."""

SmallCount = Annotated[int, Field(ge=0, le=MAX_UINT32)]
"""A non-negative integer up to 2^32-1 (stored in a UInt32 column): tool counts."""

Ordinal = Annotated[int, Field(ge=1, le=MAX_UINT32)]
"""A 1-based turn or attempt number, up to 2^32-1 (UInt32 columns)."""

Number = Annotated[float, Field()]
"""A finite JSON number (integers accepted; infinities and NaN are not)."""

NonNegNumber = Annotated[float, Field(ge=0, le=MAX_SAFE_INTEGER)]
"""A finite JSON number in 0..2^53-1 (durations in milliseconds)."""

Ratio = Annotated[float, Field(ge=0, le=1)]
"""A finite number in [0, 1] (cache hit rates)."""

Currency = Annotated[str, StringConstraints(pattern=CURRENCY_PATTERN)]
"""An ISO 4217 currency code: three capital letters."""

BundleDigest = Annotated[str, StringConstraints(pattern=BUNDLE_DIGEST_PATTERN)]
"""``snapshotRunBundle().digest``: ``sha256:`` and 64 lowercase hex digits."""

Middleware = Annotated[str, StringConstraints(pattern=MIDDLEWARE_PATTERN)]
"""The id of the middleware that answered a deterministic turn."""


class _CostType:
    """Annotation: a ``Decimal`` in [0, 10^15) with <= 12 decimals, from a string or a number."""

    __slots__ = ()

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        accepted = core_schema.union_schema(
            [
                core_schema.int_schema(strict=True),
                core_schema.float_schema(strict=True, allow_inf_nan=False),
                core_schema.str_schema(strict=True, pattern=COST_PATTERN),
                core_schema.is_instance_schema(Decimal),
            ],
            mode="left_to_right",
            custom_error_type="cost_format",
            custom_error_message=(
                "cost should be a non-negative decimal string below 10^15 with at most 12 "
                "decimal places, such as '0.0125' (no sign, exponent or spaces), or a finite "
                "JSON number"
            ),
        )
        # Every bound checks in pydantic-core: decimal_places counts the normalised value
        # (trailing zeros aside), and a float counts by its shortest repr (0.1 has one).
        bounded = core_schema.decimal_schema(
            ge=Decimal(0),
            lt=MAX_COST,
            decimal_places=COST_MAX_DECIMALS,
            allow_inf_nan=False,
            strict=False,
        )
        return core_schema.chain_schema(
            [accepted, bounded],
            serialization=core_schema.plain_serializer_function_ser_schema(
                lambda d: format(d, "f"), when_used="json"
            ),
        )

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {
            "anyOf": [
                {"type": "number", "minimum": 0, "exclusiveMaximum": 1e15},
                {"type": "string", "pattern": COST_PATTERN},
            ],
            "description": (
                "Non-negative cost below 10^15 with at most 12 decimal places: a decimal "
                "string (preferred) or a JSON number (the decimal places of a number are "
                "checked by the pipeline)."
            ),
        }


Cost = Annotated[Decimal, _CostType()]
"""A cost in [0, 10^15) with at most 12 decimals: a decimal string or a JSON number on the wire."""


def _storable(value: Any) -> bool:
    """Whether every integer in ``value`` is within +-(2^53-1) and every number finite."""
    kind = type(value)
    if kind is int:
        return -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER
    if kind is float:
        return math.isfinite(value)
    if kind is dict:
        return all(_storable(item) for item in value.values())
    if kind is list:
        return all(_storable(item) for item in value)
    return True


def _find_unstorable(value: Any, path: str = "") -> tuple[str, Any] | None:
    """(path, value) of the first integer beyond +-(2^53-1) or non-finite number in ``value``."""
    if type(value) in (int, float):
        return None if _storable(value) else (path, value)
    items: Any = ()
    if type(value) is dict:
        items = ((f"{path}.{k}" if path else str(k), v) for k, v in value.items())
    elif type(value) is list:
        items = ((f"{path}[{n}]", v) for n, v in enumerate(value))
    for sub, item in items:
        found = _find_unstorable(item, sub)
        if found is not None:
            return found
    return None


def _check_json_object(value: dict[str, Any]) -> dict[str, Any]:
    if _storable(value):  # the common case: no path strings built
        return value
    found = _find_unstorable(value)
    if found is not None:
        where, bad = found
        raise PydanticCustomError(
            "json_number_out_of_range",
            "{where} should be an integer within +-(2^53-1) or a finite number",
            {"where": where or "value", "shown": bad},
        )
    return value


class _JsonObjectType:
    """Annotation: a free-form JSON object whose numbers all fit the ledger (see module doc)."""

    __slots__ = ()

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(
            _check_json_object, core_schema.dict_schema(core_schema.str_schema(), None)
        )

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {
            "type": "object",
            "description": (
                "A free-form object; its integers stay within +-(2^53-1) (checked by the pipeline)."
            ),
        }


JsonObject = Annotated[dict[str, Any], _JsonObjectType()]
"""A free-form JSON object whose integers fit +-(2^53-1) and whose numbers are finite."""


class Utf8MaxBytes:
    """Annotation capping a string at ``max_bytes`` bytes of UTF-8 (not characters)."""

    __slots__ = ("max_bytes",)

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        limit = self.max_bytes

        def check(value: str) -> str:
            # At most 4 bytes per character: short strings cannot be over the limit.
            if len(value) * 4 > limit and len(value.encode("utf-8", "surrogatepass")) > limit:
                raise PydanticCustomError(
                    "string_too_many_bytes",
                    "String should have at most {max_bytes} bytes of UTF-8, not {actual}",
                    {"max_bytes": limit, "actual": len(value.encode("utf-8", "surrogatepass"))},
                )
            return value

        return core_schema.no_info_after_validator_function(
            check, core_schema.str_schema(max_length=limit, strict=True)
        )

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {
            "type": "string",
            "maxLength": self.max_bytes,
            "description": f"At most {self.max_bytes} bytes of UTF-8.",
        }


class _Rfc3339:
    """Annotation: an aware ``datetime`` in [1970, 2200); on the wire RFC 3339 with an offset."""

    __slots__ = ()

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        # The range checks in pydantic-core, on the instant (offsets taken into account).
        bounds: dict[str, Any] = {"tz_constraint": "aware", "ge": TS_MIN, "lt": TS_MAX}
        from_text = core_schema.chain_schema(
            [
                core_schema.str_schema(pattern=RFC3339_PATTERN, strict=True),
                core_schema.datetime_schema(strict=False, **bounds),
            ]
        )
        return core_schema.json_or_python_schema(
            json_schema=from_text,
            python_schema=core_schema.union_schema(
                [core_schema.datetime_schema(strict=True, **bounds), from_text]
            ),
            serialization=core_schema.plain_serializer_function_ser_schema(
                datetime.isoformat, when_used="json"
            ),
        )

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {
            "type": "string",
            "format": "date-time",
            "pattern": _TS_JSON_PATTERN,
            "description": (
                "RFC 3339 timestamp with seconds and a UTC offset, within "
                "[1970-01-01T00:00:00Z, 2200-01-01T00:00:00Z)."
            ),
        }


Timestamp = Annotated[datetime, _Rfc3339()]
"""An aware ``datetime`` in [1970, 2200) UTC; on the wire RFC 3339 with an offset."""
