"""Field types shared by the contract models: ids, timestamps, counts, cost, byte-capped text.

Every type validates in pydantic-core (no Python call) where the rule allows it, and
carries the JSON Schema that expresses the same rule for non-Python runtimes.
"""

from __future__ import annotations

from datetime import datetime
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
    "COST_PATTERN",
    "CURRENCY_PATTERN",
    "MIDDLEWARE_PATTERN",
    "RFC3339_PATTERN",
    "BundleDigest",
    "Cost",
    "Count",
    "Currency",
    "Id",
    "Middleware",
    "NonNegNumber",
    "Number",
    "Ordinal",
    "Ratio",
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
COST_PATTERN = r"^[0-9]+(\.[0-9]+)?$"


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

Count = Annotated[int, Field(ge=0)]
"""A non-negative integer: token counts, caps, dropped counts."""

Ordinal = Annotated[int, Field(ge=1)]
"""A 1-based turn or attempt number."""

Number = Annotated[float, Field()]
"""A finite JSON number (integers accepted)."""

NonNegNumber = Annotated[float, Field(ge=0)]
"""A finite JSON number >= 0 (durations)."""

Ratio = Annotated[float, Field(ge=0, le=1)]
"""A finite number in [0, 1] (cache hit rates)."""

Currency = Annotated[str, StringConstraints(pattern=CURRENCY_PATTERN)]
"""An ISO 4217 currency code: three capital letters."""

BundleDigest = Annotated[str, StringConstraints(pattern=BUNDLE_DIGEST_PATTERN)]
"""``snapshotRunBundle().digest``: ``sha256:`` and 64 lowercase hex digits."""

Middleware = Annotated[str, StringConstraints(pattern=MIDDLEWARE_PATTERN)]
"""The id of the middleware that answered a deterministic turn."""


class _CostType:
    """Annotation: a non-negative ``Decimal`` from a plain decimal string or a JSON number."""

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
                "cost should be a non-negative decimal string such as '0.0125' "
                "(no sign, exponent or spaces) or a finite JSON number"
            ),
        )
        return core_schema.chain_schema(
            [
                accepted,
                core_schema.decimal_schema(ge=Decimal(0), allow_inf_nan=False, strict=False),
            ],
            serialization=core_schema.plain_serializer_function_ser_schema(
                lambda d: format(d, "f"), when_used="json"
            ),
        )

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {
            "anyOf": [
                {"type": "number", "minimum": 0},
                {"type": "string", "pattern": COST_PATTERN},
            ],
            "description": "Non-negative cost: a decimal string (preferred) or a JSON number.",
        }


Cost = Annotated[Decimal, _CostType()]
"""A non-negative cost as a ``Decimal``: a decimal string or a JSON number on the wire."""


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
    """Annotation: an aware ``datetime``, on the wire RFC 3339 with seconds and an offset."""

    __slots__ = ()

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        from_text = core_schema.chain_schema(
            [
                core_schema.str_schema(pattern=RFC3339_PATTERN, strict=True),
                core_schema.datetime_schema(tz_constraint="aware", strict=False),
            ]
        )
        return core_schema.json_or_python_schema(
            json_schema=from_text,
            python_schema=core_schema.union_schema(
                [core_schema.datetime_schema(tz_constraint="aware", strict=True), from_text]
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
            "pattern": RFC3339_PATTERN,
            "description": "RFC 3339 timestamp with seconds and a UTC offset.",
        }


Timestamp = Annotated[datetime, _Rfc3339()]
"""An aware ``datetime``; on the wire an RFC 3339 string with an offset (naive is rejected)."""
