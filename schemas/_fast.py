"""An accept-only fast parse path for agent events (msgspec), with pydantic as the fallback.

``parse_fast_batch`` decodes each record value with msgspec into structs that
``build_tables`` makes at import from the schema pydantic-core validates the event classes
with, checks in Python the rules msgspec cannot express, and builds directly what the core
derives from a pydantic event: the payload in wire form (``data``, as
``model_dump(mode="json", by_alias=True, exclude_none=True)`` gives it, same key order),
the envelope values and ``ts`` in microseconds. Whenever there is any doubt the value is
declined and handed to ``parse_batch``, which stays the contract: the fast path must give
exactly what the slow path gives, or nothing.

Nothing of the contract is typed here twice: literal sets, length and numeric bounds,
patterns, aliases, field order and which fields are required all come from the schema.
What the schema holds as Python code is recognised by the function pydantic runs, with its
parameters read from the schema: the ``Usage`` and ``UsageRecordedData`` model validators
(``_RULES``), ``Utf8MaxBytes``, ``JsonObject``, ``Cost`` and the envelope's ``Timestamp``.
Any other node (an unknown validator, type, option or pattern syntax) makes its field
decline when present, or its event type (or every type) decline when the field is
required; ``TABLES.declined`` says which and why. A contract change can make the fast path
slower, never different.

It declines (among others) on:

- anything but ``bytes`` under ``max_bytes``; anything msgspec refuses (not JSON, not
  UTF-8, NaN/Infinity, not an object, a wrong type or bound, an unknown or missing
  ``type``, a missing field);
- any key the structs do not declare (``forbid_unknown_fields``), which covers the
  snake_case field names pydantic also accepts (``validate_by_name``), ``schema_``, and
  extra keys pydantic would ignore;
- any explicit ``null`` in a contract field (a free-form object keeps its nulls);
- duplicate keys anywhere (see ``_no_duplicates``), and any ``\\u003`` escape;
- a number beyond +-(2^53-1) in a float field, and free-form objects nested over 64 deep;
- a ``cost`` that is a JSON number or a string not written the way ``format(Decimal, "f")``
  writes it back (leading zeros), or with more integer digits or decimals than its bounds;
- a ``ts`` outside the forms reproduced here (see ``_ts_us``).

Patterns use ``\\A...\\Z``: they are applied with ``re.search`` (a string field's by
``_matching``, which remembers the values that matched; a cost's by msgspec), where ``$``
would also match before a trailing newline (pydantic's Rust regex engine does not).
"""

from __future__ import annotations

import gc
import math
import re
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Annotated, Any, Final, Literal, NamedTuple, Protocol, Union

import msgspec
from msgspec import Meta, Struct, UnsetType
from pydantic import BaseModel, TypeAdapter

from prism.schemas._constants import MAX_EVENT_BYTES
from prism.schemas._data import UsageRecordedData
from prism.schemas._errors import ContractViolation
from prism.schemas._events import KNOWN_EVENT_CLASSES, EventBase
from prism.schemas._parse import parse_batch
from prism.schemas._payloads import Usage
from prism.schemas._types import MAX_SAFE_INTEGER, JsonObject, Utf8MaxBytes

__all__ = ["FastEvent", "parse_fast_batch"]

# Final: the compiled parser reads a module's other globals from its dict on every use
UNSET: Final = msgspec.UNSET


class FastEvent(Struct, frozen=True):
    """What the core needs of one accepted event, equal to what it derives from pydantic's.

    ``ts_us`` is ``ts`` in microseconds since the epoch; ``data`` the payload in wire form
    (camelCase, absent fields left out, pydantic's key order); ``envelope`` the
    ownership/model/lineage values the event carries (``envelope_values``' keys and order).
    """

    event_id: str
    run_id: str
    seq: int
    type: str
    ts_us: int
    data: dict[str, Any]
    envelope: dict[str, Any]


Check = Callable[[Any], bool]


# -- the Python rules of the schema, by the function pydantic runs ----------------------------


def _priced_estimate_ok(usage: Any) -> bool:
    """``Usage._estimates_are_never_priced``: an estimate carries no cost/currency;
    confidence only on one."""
    if usage.estimated is True:
        return usage.cost is UNSET and usage.currency is UNSET
    return usage.confidence is UNSET


def _scope_ok(data: Any) -> bool:
    """``UsageRecordedData._scope_rules``: turn and attempt exactly on ``provider_turn``."""
    if data.scope == "provider_turn":
        return data.turn is not UNSET and data.attempt is not UNSET
    return data.turn is UNSET and data.attempt is UNSET


def _validator(model: type[BaseModel], name: str) -> Any:
    found = model.__pydantic_decorators__.model_validators.get(name)
    return None if found is None else found.func


# Each model validator the fast path reproduces, by its function (a renamed one is unknown).
_RULES: dict[Any, Check] = {
    function: check
    for function, check in (
        (_validator(Usage, "_estimates_are_never_priced"), _priced_estimate_ok),
        (_validator(UsageRecordedData, "_scope_rules"), _scope_ok),
    )
    if function is not None
}


def _function_of(annotation: Any) -> Any:
    """The after-validator function pydantic runs for ``annotation``; ``None`` if none."""
    try:
        return TypeAdapter(annotation).core_schema["function"]["function"]  # type: ignore[typeddict-item]
    except Exception:  # another shape: not recognised, so it declines
        return None


_JSON_OBJECT_CHECK = _function_of(JsonObject)
_UTF8_CHECK_CODE: Any = getattr(_function_of(Annotated[str, Utf8MaxBytes(1)]), "__code__", None)

# Free-form objects (the only places of unbounded nesting) nest at most this deep: far
# below pydantic's JSON depth limit (a value about 200 levels deep is not JSON to it).
_MAX_DEPTH = 64


def _storable(value: Any, depth: int = _MAX_DEPTH) -> bool:
    """``JsonObject``'s rule (integers within +-(2^53-1), finite numbers) at most ``depth``
    objects/arrays deep: pydantic's JSON parser refuses nesting of about 200 levels."""
    kind = type(value)
    if kind is int:
        return -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER  # type: ignore[no-any-return]
    if kind is float:
        return math.isfinite(value)
    if kind is dict:
        value = value.values()
    elif kind is not list:
        return True
    if depth <= 0:
        return False
    for item in value:  # noqa: SIM110 - a loop is faster than all() over a generator
        if not _storable(item, depth - 1):
            return False
    return True


def _utf8_within(limit: int) -> Check:
    """``Utf8MaxBytes(limit)``: at most ``limit`` bytes of UTF-8 (characters checked by Meta)."""

    def check(value: str) -> bool:
        return len(value) * 4 <= limit or len(value.encode("utf-8")) <= limit

    return check


def _all_items(check: Check) -> Check:
    return lambda items: all(map(check, items))


_MATCHED: Final[dict[str, set[str]]] = {}  # a pattern -> values that matched it
_MATCHED_MAX: Final = 4096  # values remembered per pattern


def _matching(pattern: str) -> Check:
    """A ``str`` field's pattern, as ``re.search`` (as msgspec's ``Meta(pattern=...)``
    applies it). Values that matched are remembered (up to ``_MATCHED_MAX`` per pattern):
    the same bundle digests come again and again, and a search called from msgspec cost
    about a tenth of the whole parse."""
    search = re.compile(pattern).search
    matched = _MATCHED.setdefault(pattern, set())

    def check(value: str) -> bool:
        if value in matched:
            return True
        if search(value) is None:
            return False
        if len(matched) >= _MATCHED_MAX:
            matched.clear()
        matched.add(value)
        return True

    return check


class _Plan(NamedTuple):
    """The checks of a struct: its fields' (on present values), then its model rules."""

    fields: tuple[tuple[str, Any], ...]
    """(attribute, its ``_Plan`` or its check)."""
    rules: tuple[Check, ...]


_Node = Union[Check, _Plan]  # noqa: UP007 - a runtime alias


def _compile(plan: _Plan) -> Check:
    """One function running every check of ``plan`` inline: one call per event, as a
    hand-written check per event type would be."""
    env: dict[str, Any] = {"UNSET": UNSET}
    lines = ["def check(v0):"]

    def emit(var: str, plan: _Plan, pad: str) -> None:
        for name, node in plan.fields:
            sub = f"v{len(env)}"
            env[sub] = None  # one name per node
            lines.extend([f"{pad}{sub} = {var}.{name}", f"{pad}if {sub} is not UNSET:"])
            if isinstance(node, _Plan):
                emit(sub, node, pad + "    ")
            else:
                env[f"f{sub}"] = node
                lines.append(f"{pad}    if not f{sub}({sub}): return False")
        for rule in plan.rules:
            name = f"r{len(env)}"
            env[name] = rule
            lines.append(f"{pad}if not {name}({var}): return False")

    emit("v0", plan, "    ")
    exec("\n".join([*lines, "    return True"]), env)  # names are identifiers (checked)
    return env["check"]  # type: ignore[no-any-return]


# -- patterns: pydantic's Rust regex syntax, the subset Python's re reads the same way ----------

_PUNCT = r"[.^$*+?()\[\]{}|\\/-]"
_PLAIN = r"A-Za-z0-9_:/@#,;=!%'\"<> "
# One token: an escaped punctuation character; a class of ASCII letters, digits, plain
# punctuation and ranges; a group (capturing or ``(?:``); ``)``; ``|``; a quantifier; a
# plain character; ``^``/``$``. Anything else (``.``, ``\d``, flags, look-around) declines.
_TOKEN = re.compile(
    rf"\\{_PUNCT}|\[\^?-?(?:[A-Za-z0-9]-[A-Za-z0-9]|\\{_PUNCT}|[{_PLAIN}.*+?(){{}}|$])+-?\]"
    rf"|\((?!\?)|\(\?:|\)|\||(?:[?*+]|\{{[0-9]+(?:,[0-9]*)?\}})\??|[{_PLAIN}-]|[$^]"
)


def _python_pattern(pattern: str) -> str | None:
    """``pattern`` for ``re.search`` with the meaning pydantic-core's regex gives it, or
    ``None`` when it uses anything beyond literals, classes, groups, ``|`` and quantifiers."""
    out: list[str] = []
    at = 0
    while at < len(pattern):
        token = _TOKEN.match(pattern, at)
        if token is None:
            return None
        text = token.group()
        # Rust's ^/$ are the text's start and end (no multi-line mode); groups need not capture.
        out.append({"^": r"\A", "$": r"\Z", "(": "(?:"}.get(text, text))
        at = token.end()
    return "".join(out)


# -- the schema walk ---------------------------------------------------------------------------


# The forms of ``ts`` ``_ts_us`` reads: any number of fraction digits (truncated to
# microseconds), t/T, z/Z, offsets up to +-23:59 (-00:00 is UTC). The fixed-width part is
# read by position; its digits are ASCII ([0-9], not \d). The schema's pattern is checked
# too (a look-ahead), unless it is this very form.
_TS_FORM = (
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}"
    r"(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})\Z"
)


class _Underivable(Exception):
    """A schema node the fast path cannot reproduce: its field declines."""


_MODEL_CONFIG = frozenset(
    {"title", "strict", "allow_inf_nan", "extra_fields_behavior", "validate_by_name"}
)


def _only(schema: Any, allowed: Iterable[str], where: str) -> None:
    """Refuse a node with any key the walk does not know (an option changing the value)."""
    extra = set(schema) - {"type", "metadata", "ref", *allowed}
    if extra:
        raise _Underivable(f"{where}: {schema['type']} with {sorted(extra)}")


def _meta(schema: Any, keys: Iterable[str], where: str) -> dict[str, Any]:
    meta = {k: schema[k] for k in keys if k in schema}
    if "pattern" in meta:
        pattern = _python_pattern(meta["pattern"])
        if pattern is None:
            raise _Underivable(f"{where}: pattern {meta['pattern']!r}")
        meta["pattern"] = pattern
    return meta


def _annotated(kind: Any, meta: dict[str, Any]) -> Any:
    return Annotated[kind, Meta(**meta)] if meta else kind


def _to_us(moment: datetime) -> int:
    return (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


# Scalar schemas msgspec checks alone, and the constraints of theirs it takes as Meta.
_SCALARS: dict[str, tuple[type, tuple[str, ...]]] = {
    "str": (str, ("min_length", "max_length", "pattern")),
    "int": (int, ("ge", "gt", "le", "lt", "multiple_of")),
    "bool": (bool, ()),
}


class _Builder:
    """Walks pydantic-core schemas into msgspec types and the Python checks they need."""

    def __init__(self) -> None:
        self.declined: list[str] = []
        self.ts_patterns: set[str] = set()
        self.ts_range: tuple[int, int] | None = None
        self._models: dict[type, tuple[Any, Any, _Plan | None]] = {}

    def value(self, schema: Any, where: str) -> tuple[Any, _Node | None]:
        """The msgspec type of a value and its Python check (``None``: msgspec does all)."""
        kind = schema["type"]
        if kind in _SCALARS:
            base, keys = _SCALARS[kind]
            _only(schema, ("strict", *keys), where)
            meta = _meta(schema, keys, where)
            pattern = meta.pop("pattern", None)
            return _annotated(base, meta), None if pattern is None else _matching(pattern)
        if kind == "float":
            _only(schema, ("strict", "ge", "gt", "le", "lt", "allow_inf_nan"), where)
            return _annotated(float, self._float_bounds(schema)), None
        if kind == "literal":
            _only(schema, ("expected",), where)
            expected = schema["expected"]
            if not expected or not all(type(v) is str for v in expected):
                raise _Underivable(f"{where}: literal {expected!r}")
            return Literal[tuple(expected)], None
        if kind == "list":
            _only(schema, ("strict", "items_schema", "min_length", "max_length"), where)
            if "items_schema" not in schema:
                raise _Underivable(f"{where}: list of any")
            item, check = self.value(schema["items_schema"], f"{where}[]")
            meta = _meta(schema, ("min_length", "max_length"), where)
            if isinstance(check, _Plan):
                check = _compile(check)
            return _annotated(list[item], meta), None if check is None else _all_items(check)  # type: ignore[valid-type]
        if kind == "dict":
            _only(schema, ("strict", "keys_schema", "values_schema"), where)
            if schema.get("keys_schema", {"type": "str"}) != {"type": "str"} or schema.get(
                "values_schema", {"type": "any"}
            ) != {"type": "any"}:
                raise _Underivable(f"{where}: dict of constrained keys or values")
            return dict[str, Any], _storable  # never looser than JsonObject's rule
        if kind == "model":
            return self.model(schema, where)
        if kind == "function-after":
            return self._after(schema, where)
        if kind == "chain":
            return self._cost(schema, where), None
        raise _Underivable(f"{where}: {kind} schema")

    def _float_bounds(self, schema: Any) -> dict[str, Any]:
        """The bounds, within +-(2^53-1): a JSON integer beyond becomes a float by rounding,
        which is not worth trusting here."""
        meta: dict[str, Any] = {}
        for strict, loose, clamp, tighter in (
            ("gt", "ge", -MAX_SAFE_INTEGER, max),
            ("lt", "le", MAX_SAFE_INTEGER, min),
        ):
            if strict in schema and loose in schema:
                raise _Underivable(f"float with both {strict} and {loose}")
            if strict in schema and tighter(schema[strict], clamp) == schema[strict]:
                meta[strict] = schema[strict]
            else:
                meta[loose] = tighter(schema.get(loose, clamp), clamp)
        return meta

    def _after(self, schema: Any, where: str) -> tuple[Any, _Node | None]:
        """An after-validator: a model rule, ``JsonObject`` or ``Utf8MaxBytes``."""
        _only(schema, ("function", "schema"), where)
        function = schema["function"].get("function")
        inner = schema["schema"]
        if inner["type"] == "model" and function in _RULES:
            kind, check = self.model(inner, where)
            rule = _RULES[function]
            return kind, _Plan((), (rule,)) if check is None else check._replace(
                rules=(*check.rules, rule)
            )
        if function is _JSON_OBJECT_CHECK and inner["type"] == "dict":
            return self.value(inner, where)  # _storable is JsonObject's rule, depth-bounded
        code: Any = getattr(function, "__code__", None)
        if code is not None and code is _UTF8_CHECK_CODE and inner["type"] == "str":
            names = code.co_freevars
            limit = function.__closure__[names.index("limit")].cell_contents
            kind, inner_check = self.value(inner, where)
            if inner_check is not None:  # a pattern under it: not a schema Utf8MaxBytes makes
                raise _Underivable(f"{where}: Utf8MaxBytes over a checked string")
            return kind, _utf8_within(limit)
        raise _Underivable(f"{where}: validator {getattr(function, '__qualname__', function)}")

    def _cost(self, schema: Any, where: str) -> Any:
        """``Cost``: a JSON string the union's pattern and the decimal's bounds accept, written
        as ``format(Decimal(s), "f")`` gives it back (a JSON number declines)."""
        _only(schema, ("steps", "serialization"), where)
        steps = schema["steps"]
        if len(steps) != 2 or steps[0]["type"] != "union" or steps[1]["type"] != "decimal":
            raise _Underivable(f"{where}: chain of {[s['type'] for s in steps]}")
        union, bounds = steps
        _only(union, ("choices", "mode", "custom_error_type", "custom_error_message"), where)
        _only(bounds, ("ge", "lt", "decimal_places", "allow_inf_nan", "strict"), where)
        text = None
        for choice in union["choices"]:  # nothing before the str branch takes a JSON string
            if choice["type"] == "str":
                text = choice
                break
            if choice["type"] not in ("int", "float", "is-instance") or (
                choice["type"] != "is-instance" and choice.get("strict") is not True
            ):
                break
        if union.get("mode") != "left_to_right" or text is None or bounds.get("ge", 0) > 0:
            raise _Underivable(f"{where}: cost union {union.get('mode')}")
        _only(text, ("pattern", "strict"), where)
        lt, places = bounds.get("lt"), bounds.get("decimal_places")
        digits = None if lt is None else len(str(int(lt))) - 1  # lt must be 10^digits
        if digits is not None and (digits < 1 or lt != Decimal(10) ** digits):
            raise _Underivable(f"{where}: cost below {lt}")
        whole = "[1-9][0-9]*" if digits is None else f"[1-9][0-9]{{0,{digits - 1}}}"
        fraction = "" if places == 0 else "[0-9]+" if places is None else f"[0-9]{{1,{places}}}"
        own = _meta(text, ("pattern",), where).get("pattern", "")
        pattern = rf"\A(?={own})(?:0|{whole})" + (rf"(?:\.{fraction})?\Z" if fraction else r"\Z")
        serialize = schema.get("serialization", {})
        samples = ["0", "7", "9" * (digits or 3)]
        samples += ["0.0", "10.50", "9.0" + "9" * ((places or 3) - 2)] if fraction else []
        try:
            same = all(serialize["function"](Decimal(s)) == s for s in samples)
        except Exception:  # a serializer not reproduced: decline
            same = False
        if not same or set(serialize) != {"type", "function", "when_used"}:
            raise _Underivable(f"{where}: cost serializer")
        return Annotated[str, Meta(pattern=pattern)]

    def _timestamp(self, schema: Any, where: str) -> Any:
        """``Timestamp`` (the envelope's ``ts``): the pattern's text, read by ``_ts_us``."""
        _only(schema, ("json_schema", "python_schema", "serialization"), where)
        chain = schema["json_schema"]
        steps = chain.get("steps", [])
        if chain["type"] != "chain" or [s["type"] for s in steps] != ["str", "datetime"]:
            raise _Underivable(f"{where}: timestamp schema")
        moment = steps[1]
        _only(moment, ("ge", "lt", "tz_constraint", "microseconds_precision", "strict"), where)
        if (
            moment.get("tz_constraint") != "aware"
            or moment.get("microseconds_precision", "truncate") != "truncate"
            or "ge" not in moment
            or "lt" not in moment
        ):
            raise _Underivable(f"{where}: datetime options")
        lo, hi = _to_us(moment["ge"]), _to_us(moment["lt"])
        if self.ts_range is not None:  # one range for every type: the narrowest
            lo, hi = max(lo, self.ts_range[0]), min(hi, self.ts_range[1])
        self.ts_range = (lo, hi)
        _only(steps[0], ("strict", "pattern"), where)  # the pattern is read with _TS_FORM
        self.ts_patterns.add(_meta(steps[0], ("pattern",), where).get("pattern", ""))
        return str

    def model(self, schema: Any, where: str, tag: bool = False) -> tuple[Any, _Plan | None]:
        """A struct of the model's fields in its order, its aliases as keys, optional fields
        ``UNSET`` when absent; with ``tag``, the event's ``type`` literal is its tag."""
        cls = schema["cls"]
        cached = self._models.get(cls)
        if cached is not None and cached[0] == schema and not tag:
            return cached[1], cached[2]
        _only(schema, ("cls", "config", "custom_init", "root_model", "schema"), where)
        config = schema.get("config", {})
        _only({"type": "config", **config}, _MODEL_CONFIG | {"validate_by_alias"}, where)
        fields_schema = schema["schema"]
        _only(fields_schema, ("fields", "model_name", "computed_fields"), where)
        if (
            schema.get("custom_init")
            or schema.get("root_model")
            or fields_schema.get("computed_fields")
        ) or config.get("validate_by_alias", True) is not True:
            raise _Underivable(f"{where}: model options")
        fields: list[tuple[Any, ...]] = []
        renames: dict[str, str] = {}
        checks: list[tuple[str, _Node]] = []
        tag_value = None
        for name, field in fields_schema["fields"].items():
            at = f"{where}.{name}"
            _only(field, ("schema", "validation_alias", "serialization_alias", "frozen"), at)
            key = field.get("validation_alias", name)
            if not name.isidentifier():
                raise _Underivable(f"{at}: field name")
            if not isinstance(key, str) or field.get("serialization_alias", name) != key:
                raise _Underivable(f"{at}: alias {key!r}")
            inner = field["schema"]
            if tag and name == "type":
                expected = inner.get("expected", [])
                if inner["type"] != "literal" or len(expected) != 1 or type(expected[0]) is not str:
                    raise _Underivable(f"{at}: not one literal")
                tag_value = expected[0]
                continue
            optional = inner["type"] == "default"
            if optional:
                _only(inner, ("schema", "default"), at)
                if inner["default"] is not None:
                    raise _Underivable(f"{at}: default {inner['default']!r}")
                inner = inner["schema"]
            if inner["type"] == "nullable":  # a null declines: absent stays absent
                _only(inner, ("schema", "strict"), at)
                inner = inner["schema"]
            try:
                if tag and name == "ts":
                    kind, check = self._timestamp(inner, at), None
                else:
                    kind, check = self.value(inner, at)
            except _Underivable as why:
                if not optional:
                    raise
                self.declined.append(f"{why} (declined when present)")
                kind, check = UnsetType, None
            fields.append((name, kind | UnsetType, UNSET) if optional else (name, kind))
            if key != name:
                renames[name] = key
            if check is not None:
                checks.append((name, check))
        struct = msgspec.defstruct(
            f"_{fields_schema.get('model_name', cls.__name__)}",
            fields,
            kw_only=True,
            forbid_unknown_fields=True,
            rename=renames,
            tag_field="type" if tag else None,
            tag=tag_value if tag else None,
        )
        if tag and tag_value is None:
            raise _Underivable(f"{where}: no type")
        check = _Plan(tuple(checks), ()) if checks else None
        if not tag:
            self._models[cls] = (schema, struct, check)
        return struct, check


class Accept(Protocol):
    """``Tables.accept``: ``scratch`` is optional, so a single value can be judged alone."""

    def __call__(self, raw: bytes, scratch: bytearray | None = None) -> FastEvent | None: ...


class Tables(NamedTuple):
    """What the fast path runs on, all made from the event classes' schemas."""

    accept: Accept
    """A value as a ``FastEvent``, or ``None`` to decline (the caller checks type and size);
    ``scratch``, a buffer the caller reuses from value to value (one per thread)."""
    models: dict[type, type[BaseModel]]
    """Each event struct and the class it was made from."""
    ts_range: tuple[int, int]
    """Accepted ``ts`` in microseconds since the epoch: [first, end)."""
    declined: tuple[str, ...]
    """What the schema holds that the fast path does not reproduce, so declines."""


def build_tables(classes: Iterable[type[EventBase]] = KNOWN_EVENT_CLASSES) -> Tables:
    """The fast path's structs and checks, made from the pydantic-core schema of ``classes``.

    >>> build_tables().declined
    ()
    """
    builder = _Builder()
    checks: dict[type, Check] = {}
    types: dict[type, str] = {}
    models: dict[type, type[BaseModel]] = {}
    for cls in classes:
        try:
            struct, plan = builder.model(cls.__pydantic_core_schema__, cls.__name__, tag=True)  # type: ignore[arg-type]
        except _Underivable as why:
            builder.declined.append(f"{why} (every {cls.__name__} declined)")
            continue
        except Exception as exc:  # a schema shape never seen: decline it
            builder.declined.append(f"{cls.__name__}: {exc!r} (every {cls.__name__} declined)")
            continue
        types[struct] = struct.__struct_config__.tag  # type: ignore[assignment]
        models[struct] = cls
        if isinstance(plan, _Plan):
            checks[struct] = _compile(plan)
    ts_range = builder.ts_range or (0, 0)
    if not types or builder.ts_range is None:
        return Tables(lambda raw, scratch=None: None, models, ts_range, tuple(builder.declined))
    decode = msgspec.json.Decoder(Union[tuple(types)]).decode  # type: ignore[misc]  # noqa: UP007
    same = r"\A" + re.sub(r"\((?!\?)", "(?:", _TS_FORM)  # the form, as _python_pattern writes it
    ahead = "".join(f"(?={p})" for p in sorted(builder.ts_patterns - {same}))
    ts_match = re.compile(ahead + _TS_FORM)
    accept = _acceptor(decode, checks, types, ts_match.match, ts_range)
    return Tables(accept, models, ts_range, tuple(builder.declined))


_encode_into: Final = msgspec.json.Encoder().encode_into
_to_builtins: Final = msgspec.to_builtins


# -- ts: RFC 3339 as pydantic (speedate) reads it ---------------------------------------------

_EPOCH_ORDINAL: Final = date(1970, 1, 1).toordinal()
_FRACTION_SCALE: Final = (0, 100_000, 10_000, 1_000, 100, 10, 1)
_minute_us: Final[dict[str, int]] = {}  # "YYYY-MM-DDTHH:MM" -> its microseconds (before the offset)
_offset_us: Final[dict[str, int]] = {}  # "Z", "+01:00"... -> the offset in microseconds
_CACHE_MAX: Final = 4096


def _minute_of(prefix: str) -> int | None:
    """Microseconds from the epoch to ``YYYY-MM-DDTHH:MM`` (as if UTC); ``None`` if invalid."""
    try:
        day = date(int(prefix[:4]), int(prefix[5:7]), int(prefix[8:10]))
    except ValueError:
        return None
    hour, minute = int(prefix[11:13]), int(prefix[14:16])
    if hour > 23 or minute > 59:
        return None
    return ((day.toordinal() - _EPOCH_ORDINAL) * 86400 + hour * 3600 + minute * 60) * 1_000_000


def _offset_of(zone: str) -> int | None:
    """The offset of ``Z`` or ``+HH:MM``/``-HH:MM`` in microseconds; ``None`` if invalid."""
    if zone in ("Z", "z"):
        return 0
    hours, minutes = int(zone[1:3]), int(zone[4:6])
    if hours > 23 or minutes > 59:
        return None
    offset = (hours * 3600 + minutes * 60) * 1_000_000
    return offset if zone[0] == "+" else -offset


def _ts_us(ts: str, match: Callable[[str], re.Match[str] | None]) -> int | None:
    """``to_us`` of the datetime pydantic makes of ``ts`` (``match``: its form and the
    schema's pattern); ``None`` (decline) if in doubt."""
    m = match(ts)
    if m is None:
        return None
    prefix = ts[:16]
    base = _minute_us.get(prefix)
    if base is None:
        base = _minute_of(prefix)
        if base is None:
            return None
        if len(_minute_us) >= _CACHE_MAX:
            _minute_us.clear()
        _minute_us[prefix] = base
    frac, zone = m.groups()
    offset = _offset_us.get(zone)
    if offset is None:
        offset = _offset_of(zone)
        if offset is None:
            return None
        if len(_offset_us) >= _CACHE_MAX:
            _offset_us.clear()
        _offset_us[zone] = offset
    second = int(ts[17:19])
    if second > 59:
        return None
    us = base + second * 1_000_000 - offset
    if frac:  # ".digits", truncated to microseconds as pydantic does
        us += int(frac[1:]) * _FRACTION_SCALE[len(frac) - 1] if len(frac) <= 7 else int(frac[1:7])
    return us


def _no_duplicates(raw: bytes, ev: Any, scratch: bytearray) -> bool:
    """Whether ``raw`` has no duplicate key anywhere (pydantic and msgspec keep the last one).

    Every key of ``raw`` is a field of the structs or a key of a free-form object (unknown
    keys decline), so re-encoding ``ev`` writes every key once. Outside strings a colon
    only follows a key; inside strings each literal colon decodes to one colon, which is
    re-encoded literally (the caller declines ``\\u003a`` escapes). So both texts hold the
    same number of colons exactly when no key was dropped as a duplicate. (``ev`` is encoded
    into ``scratch``, which takes the text's length: no new bytes object per value.)
    """
    _encode_into(ev, scratch)
    return raw.count(b":") == scratch.count(b":")


# the envelope values an event carries at its top level (not under agent, model, parent),
# in ``envelope_values``' order; not the core's ``OWNER_FIELDS`` (the rows' owner)
_TOP_LEVEL_ENVELOPE: Final = ("tenant_id", "account_id", "user_id", "session_id")


def _envelope(ev: Any) -> dict[str, Any]:
    """``envelope_values``: its keys in its order, absent values left out."""
    # each attribute read once: compiled, a struct's attribute is a generic lookup
    env: dict[str, Any] = {}
    for name in _TOP_LEVEL_ENVELOPE:
        value = getattr(ev, name)
        if value is not UNSET:
            env[name] = value
    agent = ev.agent
    if agent is not UNSET:
        env["agent_id"] = agent.id
        value = agent.definition_revision
        if value is not UNSET:
            env["agent_definition_revision"] = value
    model = ev.model
    if model is not UNSET:
        env["provider"] = model.provider
        env["model"] = model.model
    parent = ev.parent
    if parent is not UNSET:
        env["parent_run_id"] = parent.run_id
        env["delegation_id"] = parent.delegation_id
        value = parent.child_id
        if value is not UNSET:
            env["child_id"] = value
    value = ev.bundle_digest
    if value is not UNSET:
        env["bundle_digest"] = value
    return env


def _acceptor(
    decode: Callable[[bytes], Any],
    checks: dict[type, Check],
    types: dict[type, str],
    ts_match: Callable[[str], re.Match[str] | None],
    ts_range: tuple[int, int],
) -> Accept:
    """``Tables.accept`` over these tables (bound once, read as closure cells per value)."""
    first, end = ts_range

    def accept(raw: bytes, scratch: bytearray | None = None) -> FastEvent | None:
        if raw.find(b"\\u003") != -1:  # an escaped ':' would break the duplicate-key count
            # (``find``, not ``in``: ``in`` first tries the operand as an integer and
            # formats the TypeError it then discards)
            return None
        try:
            ev = decode(raw)
            check = checks.get(type(ev))
            if check is not None and not check(ev):
                return None
            ts_us = _ts_us(ev.ts, ts_match)
            if ts_us is None or not first <= ts_us < end:
                return None
            if not _no_duplicates(raw, ev, bytearray() if scratch is None else scratch):
                return None
            return FastEvent(
                ev.event_id,
                ev.run_id,
                ev.seq,
                types[type(ev)],
                ts_us,
                _to_builtins(ev.data),
                _envelope(ev),
            )
        except Exception:  # any refusal (or surprise) declines
            return None

    return accept


TABLES = build_tables()


def parse_fast_batch(
    values: Sequence[object], max_bytes: int = MAX_EVENT_BYTES
) -> list[FastEvent | EventBase | ContractViolation]:
    """Each value as a ``FastEvent`` when the fast path accepts it, else what ``parse_batch``
    returns for it (one ``parse_batch`` call for all declined values; order kept).
    ``values`` are typed ``object``: compiled (``make compile``), a narrower type would be
    checked on every value and refuse a ``str`` that ``parse_batch`` judges.

    >>> out = parse_fast_batch([b'{"schema": "prism.agent-event/v1", "eventId": "e1",'
    ...     b' "runId": "r1", "seq": 0, "type": "agent_started", "ts": "1970-01-01T00:00:01Z",'
    ...     b' "data": {}}', b"{}"])
    >>> out[0].ts_us, out[0].data, type(out[1]).__name__
    (1000000, {}, 'ContractViolation')
    """
    out: list[Any] = []
    append = out.append
    declined: list[int] = []
    declined_values: list[Any] = []
    accept = TABLES.accept
    scratch = bytearray()  # this call's own: calls in other threads have theirs
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for raw in values:
            result = accept(raw, scratch) if type(raw) is bytes and len(raw) <= max_bytes else None
            if result is None:
                declined.append(len(out))
                declined_values.append(raw)
            append(result)
    finally:
        if gc_was_enabled:
            gc.enable()
    if declined:
        for i, slow in zip(declined, parse_batch(declined_values, max_bytes), strict=True):
            out[i] = slow
    return out
