"""An accept-only fast parse path for agent events (msgspec), with pydantic as the fallback.

``parse_fast_batch`` decodes each record value with msgspec into structs that mirror the
contract models, checks in Python the rules msgspec cannot express, and builds directly
what the core derives from a pydantic event: the payload in wire form (``data``, as
``model_dump(mode="json", by_alias=True, exclude_none=True)`` gives it, same key order),
the envelope values and ``ts`` in microseconds. Whenever there is any doubt the value is
declined and handed to ``parse_batch``, which stays the contract: the fast path must give
exactly what the slow path gives, or nothing.

It declines (among others) on:

- anything but ``bytes`` under ``max_bytes``; anything msgspec refuses (not JSON, not
  UTF-8, NaN/Infinity, not an object, a wrong type or bound, an unknown or missing
  ``type``, a missing field);
- any key the structs do not declare (``forbid_unknown_fields``), which covers the
  snake_case field names pydantic also accepts (``populate_by_name``), ``schema_``, and
  extra keys pydantic would ignore;
- any explicit ``null`` in a contract field (a free-form object keeps its nulls);
- duplicate keys anywhere (see ``_no_duplicates``), and any ``\\u003`` escape;
- a ``cost`` that is a JSON number or a string with leading zeros or more than 12
  decimals (only ``0`` or ``[1-9][0-9]{0,14}`` with optional ``.`` and 1..12 digits);
- a ``ts`` outside the forms reproduced here (see ``_ts_us``).

Patterns use ``\\A...\\Z``: msgspec applies them with ``re.search``, where ``$`` would also
match before a trailing newline (pydantic's regex engine does not).
"""

from __future__ import annotations

import gc
import math
import re
import warnings
from collections.abc import Callable, Sequence
from datetime import date
from typing import Annotated, Any, Literal, Union, cast

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType
from pydantic.alias_generators import to_camel

from prism.schemas._constants import MAX_EVENT_BYTES
from prism.schemas._data import (
    CLOSEST_MAX_ITEMS,
    LAST_TOOL_CALL_HASHES_MAX_ITEMS,
    STOP_DETAIL_MAX_BYTES,
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
    ProviderTurnFinishedData,
    RunLimitExceededData,
    RunResumedData,
    RunSuspendedData,
    ToolCallFinishedData,
    ToolNarrowingClampedData,
    UsageRecordedData,
)
from prism.schemas._errors import ContractViolation
from prism.schemas._events import KNOWN_EVENT_CLASSES, EventBase
from prism.schemas._parse import parse_batch
from prism.schemas._payloads import (
    ERROR_MESSAGE_MAX_BYTES,
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
from prism.schemas._types import (
    MAX_SAFE_INTEGER,
    MAX_SEQ,
    MAX_UINT32,
    TS_MAX,
    TS_MIN,
    WireModel,
)

__all__ = ["FastEvent", "parse_fast_batch"]


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


# -- field types (pydantic's, as msgspec constraints) ---------------------------------------

_Id = Annotated[str, Meta(min_length=1, max_length=128)]
_Seq = Annotated[int, Meta(ge=0, le=MAX_SEQ)]
_Count = Annotated[int, Meta(ge=0, le=MAX_SAFE_INTEGER)]
_SmallCount = Annotated[int, Meta(ge=0, le=MAX_UINT32)]
_Ordinal = Annotated[int, Meta(ge=1, le=MAX_UINT32)]
# pydantic allows any finite number; beyond +-(2^53-1) the fast path declines (a JSON
# integer that large becomes a float by rounding, which is not worth trusting here).
_Number = Annotated[float, Meta(ge=-MAX_SAFE_INTEGER, le=MAX_SAFE_INTEGER)]
_NonNegNumber = Annotated[float, Meta(ge=0, le=MAX_SAFE_INTEGER)]
_Ratio = Annotated[float, Meta(ge=0, le=1)]
_Currency = Annotated[str, Meta(pattern=r"\A[A-Z]{3}\Z")]
_BundleDigest = Annotated[str, Meta(pattern=r"\Asha256:[0-9a-f]{64}\Z")]
_Middleware = Annotated[str, Meta(pattern=r"\A[A-Za-z0-9._:-]{1,64}\Z")]
_Rule = Annotated[str, Meta(pattern=r"\Apack:[A-Za-z0-9._-]{1,64}/[A-Za-z0-9._:-]{1,128}\Z")]
_Tool = Annotated[str, Meta(min_length=1, max_length=256)]
# The subset of COST_PATTERN whose ``format(Decimal(s), "f")`` is ``s`` itself.
_Cost = Annotated[str, Meta(pattern=r"\A(?:0|[1-9][0-9]{0,14})(?:\.[0-9]{1,12})?\Z")]
_Message = Annotated[str, Meta(max_length=ERROR_MESSAGE_MAX_BYTES)]  # + bytes, checked below
_StopDetail = Annotated[str, Meta(max_length=STOP_DETAIL_MAX_BYTES)]  # + bytes, checked below
_JsonObject = dict[str, Any]  # + _storable, checked below

_TurnStopReason = Literal[
    "end_turn",
    "tool_calls",
    "max_output_tokens",
    "content_filter",
    "abort",
    "provider_error",
    "unknown",
]
_FinishStopReason = Literal["host_policy", "turn_limit", "token_limit", "refusal"]
_FailureClass = Literal["quota", "auth", "rate_limited", "transient", "permanent", "unknown"]


class _W(Struct, rename=to_camel, forbid_unknown_fields=True, kw_only=True):
    """Base of the mirrors: pydantic's aliases, no unknown key, fields in pydantic's order.

    Optional fields default to ``UNSET`` and do not accept ``null``: absent stays absent
    (``to_builtins`` leaves it out, as ``exclude_none`` does), a ``null`` declines.
    """


# -- payloads (schemas/_payloads.py) --------------------------------------------------------


class _Usage(_W, kw_only=True):
    input_tokens: _Count | UnsetType = UNSET
    output_tokens: _Count | UnsetType = UNSET
    total_tokens: _Count | UnsetType = UNSET
    cache_read_tokens: _Count | UnsetType = UNSET
    cache_write_tokens: _Count | UnsetType = UNSET
    cost: _Cost | UnsetType = UNSET
    currency: _Currency | UnsetType = UNSET
    estimated: bool | UnsetType = UNSET
    confidence: Literal["medium", "low"] | UnsetType = UNSET


class _ErrorInfo(_W, kw_only=True):
    code: str
    message: _Message
    failure_class: _FailureClass | UnsetType = UNSET


class _Budgets(_W, kw_only=True):
    input_tokens: _Count | UnsetType = UNSET
    input_cap: _Count | UnsetType = UNSET
    run_input_budget: _Count | UnsetType = UNSET
    run_input_used: _Count
    turns: _Count
    max_turns: _Count


class _ToolsInfo(_W, kw_only=True):
    count: _SmallCount
    ids_hash: str


class _CacheInfo(_W, kw_only=True):
    cache_read_tokens: _Count | UnsetType = UNSET
    cache_write_tokens: _Count | UnsetType = UNSET
    hit_rate: _Ratio | UnsetType = UNSET


class _Breach(_W, kw_only=True):
    limit: str
    maximum: _Number
    observed: _Number


class _ClosestAxis(_W, kw_only=True):
    axis: str
    used: _Number
    maximum: _Number


class _AgentRef(_W, kw_only=True):
    id: str
    definition_revision: str | UnsetType = UNSET


class _ModelRef(_W, kw_only=True):
    provider: str
    model: str


class _ParentRef(_W, kw_only=True):
    run_id: _Id
    delegation_id: str
    child_id: str | UnsetType = UNSET


# -- data payloads (schemas/_data.py) -------------------------------------------------------


class _AgentStartedData(_W, kw_only=True):
    limits: _JsonObject | UnsetType = UNSET
    idempotency_key: str | UnsetType = UNSET


class _ProviderTurnFinishedData(_W, kw_only=True):
    turn: _Ordinal
    attempt: _Ordinal
    latency_ms: _NonNegNumber
    stop_reason: _TurnStopReason
    budgets: _Budgets
    tools: _ToolsInfo
    cache: _CacheInfo | UnsetType = UNSET
    usage: _Usage | UnsetType = UNSET


class _DeterministicTurnFinishedData(_W, kw_only=True):
    turn: _Ordinal
    middleware: _Middleware


class _ToolCallFinishedData(_W, kw_only=True):
    turn: _Ordinal
    tool: str
    call_id_hash: str
    duration_ms: _NonNegNumber
    ok: bool
    error_code: str | UnsetType = UNSET


class _ToolNarrowingClampedData(_W, kw_only=True):
    turn: _Ordinal
    dropped: list[str]


class _RunSuspendedData(_W, kw_only=True):
    reason: str | UnsetType = UNSET


class _RunResumedData(_W, kw_only=True):
    reason: str | UnsetType = UNSET


class _RunLimitExceededData(_W, kw_only=True):
    limit: str
    maximum: _Number
    observed: _Number
    currency: _Currency | UnsetType = UNSET


class _BudgetExhaustedData(_W, kw_only=True):
    axis: str
    counters: _JsonObject
    closest: Annotated[list[_ClosestAxis], Meta(max_length=CLOSEST_MAX_ITEMS)]
    last_tool_call_hashes: Annotated[list[str], Meta(max_length=LAST_TOOL_CALL_HASHES_MAX_ITEMS)]


class _ChildMilestoneData(_W, kw_only=True):
    delegation_id: str
    child_id: str
    child_run_id: _Id | UnsetType = UNSET
    turn: _Ordinal | UnsetType = UNSET


class _ChildFailedData(_W, kw_only=True):
    delegation_id: str
    child_id: str
    child_run_id: _Id | UnsetType = UNSET
    error: _ErrorInfo
    breach: _Breach | UnsetType = UNSET


class _DelegationChildEventsCappedData(_W, kw_only=True):
    delegation_id: str
    cap: _Count


class _DelegationChildEventsCoalescedData(_W, kw_only=True):
    delegation_id: str
    dropped: _Count


class _UsageRecordedData(_W, kw_only=True):
    scope: Literal["provider_turn", "run_total"]
    turn: _Ordinal | UnsetType = UNSET
    attempt: _Ordinal | UnsetType = UNSET
    entry_id: str | UnsetType = UNSET
    usage: _Usage


class _ExtensionErrorData(_W, kw_only=True):
    extension: str
    code: str


class _GuardrailDeniedData(_W, kw_only=True):
    turn: _Ordinal | UnsetType = UNSET
    tool: _Tool | UnsetType = UNSET
    rule: _Rule
    stage: Literal["before_tool", "after_tool", "input", "output"]


class _AgentFinishedData(_W, kw_only=True):
    finish_reason: str | UnsetType = UNSET
    stop_reason: _FinishStopReason | UnsetType = UNSET
    stop_detail: _StopDetail | UnsetType = UNSET


class _AgentDeniedData(_W, kw_only=True):
    reason: str


class _ErrorEventData(_W, kw_only=True):
    error: _ErrorInfo
    aborted: bool | UnsetType = UNSET
    abort_reason: str | UnsetType = UNSET


# -- envelope and events (schemas/_events.py) ------------------------------------------------


class _Env(_W, tag_field="type", kw_only=True):
    schema: Literal["prism.agent-event/v1"]
    event_id: _Id
    run_id: _Id
    seq: _Seq
    ts: str  # RFC 3339, checked and converted by _ts_us
    session_id: str | UnsetType = UNSET
    tenant_id: str | UnsetType = UNSET
    account_id: str | UnsetType = UNSET
    user_id: str | UnsetType = UNSET
    agent: _AgentRef | UnsetType = UNSET
    model: _ModelRef | UnsetType = UNSET
    parent: _ParentRef | UnsetType = UNSET
    bundle_digest: _BundleDigest | UnsetType = UNSET


# Each payload mirror and the pydantic model it mirrors.
_PAYLOAD_MIRRORS: tuple[tuple[type[Struct], type[WireModel]], ...] = (
    (_Usage, Usage),
    (_ErrorInfo, ErrorInfo),
    (_Budgets, Budgets),
    (_ToolsInfo, ToolsInfo),
    (_CacheInfo, CacheInfo),
    (_Breach, Breach),
    (_ClosestAxis, ClosestAxis),
    (_AgentRef, AgentRef),
    (_ModelRef, ModelRef),
    (_ParentRef, ParentRef),
)

# Each event type's ``data`` mirror, by the pydantic data model it mirrors.
_DATA_MIRRORS: dict[type[WireModel], type[_W]] = {
    AgentStartedData: _AgentStartedData,
    ProviderTurnFinishedData: _ProviderTurnFinishedData,
    DeterministicTurnFinishedData: _DeterministicTurnFinishedData,
    ToolCallFinishedData: _ToolCallFinishedData,
    ToolNarrowingClampedData: _ToolNarrowingClampedData,
    RunSuspendedData: _RunSuspendedData,
    RunResumedData: _RunResumedData,
    RunLimitExceededData: _RunLimitExceededData,
    BudgetExhaustedData: _BudgetExhaustedData,
    ChildMilestoneData: _ChildMilestoneData,
    ChildFailedData: _ChildFailedData,
    DelegationChildEventsCappedData: _DelegationChildEventsCappedData,
    DelegationChildEventsCoalescedData: _DelegationChildEventsCoalescedData,
    UsageRecordedData: _UsageRecordedData,
    ExtensionErrorData: _ExtensionErrorData,
    GuardrailDeniedData: _GuardrailDeniedData,
    AgentFinishedData: _AgentFinishedData,
    AgentDeniedData: _AgentDeniedData,
    ErrorEventData: _ErrorEventData,
}


def _event_structs() -> tuple[dict[type[_Env], type[WireModel]], dict[type[_Env], str]]:
    """One struct per known event class, made from it: the envelope (``_Env``), its
    ``type`` literal as the tag and the mirror of its ``data`` model. A class whose data
    model has no mirror gets none: its values are declined (``_drift`` reports it)."""
    models: dict[type[_Env], type[WireModel]] = {}
    tags: dict[type[_Env], str] = {}
    for model in KNOWN_EVENT_CLASSES:
        data = _DATA_MIRRORS.get(model.model_fields["data"].annotation)  # type: ignore[arg-type]
        if data is None:
            continue
        tag = model.model_fields["type"].annotation.__args__[0]  # type: ignore[union-attr]
        struct = cast(
            type[_Env],
            msgspec.defstruct(
                f"_{model.__name__}", [("data", data)], bases=(_Env,), tag=tag, kw_only=True
            ),
        )
        models[struct] = model
        tags[struct] = tag
    return models, tags


_EVENT_MODELS, _TYPE_OF = _event_structs()

# Each mirror and the pydantic model it mirrors (checked by _drift at import).
MIRRORS: tuple[tuple[type[Struct], type[WireModel]], ...] = (
    *_PAYLOAD_MIRRORS,
    *((struct, model) for model, struct in _DATA_MIRRORS.items()),
    *_EVENT_MODELS.items(),
)


def _wire_names(model: type[WireModel]) -> list[tuple[str, bool]]:
    """(wire key, required) of each field of a pydantic model, in declaration order."""
    out = []
    for name, info in model.model_fields.items():
        key = info.validation_alias if isinstance(info.validation_alias, str) else info.alias
        out.append((key or name, info.is_required()))
    return out


def _struct_names(struct: type[Struct]) -> list[tuple[str, bool]]:
    """(wire key, required) of each field of a mirror (its tag as a required ``type``)."""
    info = msgspec.inspect.type_info(struct)
    assert isinstance(info, msgspec.inspect.StructType)
    out = [(f.encode_name, f.required) for f in info.fields]
    if info.tag_field is not None:
        out.append((info.tag_field, True))
    return out


def _drift() -> list[str]:
    """Where a mirror no longer matches its model (names, order, required); [] when none.

    Event mirrors are compared as sets (the envelope's order is built by hand); payload
    mirrors in order (``data`` keeps pydantic's key order).
    """
    problems = [
        f"{model.__name__} has no data mirror"
        for model in KNOWN_EVENT_CLASSES
        if model not in _EVENT_MODELS.values()
    ]
    for struct, model in MIRRORS:
        mine, theirs = _struct_names(struct), _wire_names(model)
        same = sorted(mine) == sorted(theirs) if issubclass(struct, _Env) else mine == theirs
        if not same:
            problems.append(f"{struct.__name__} != {model.__name__}: {mine} vs {theirs}")
    return problems


DRIFT = _drift()
if DRIFT:  # pragma: no cover - a contract model changed without its mirror
    warnings.warn(
        "schemas._fast: msgspec mirrors differ from the pydantic models; the fast path is "
        "off (every value takes parse_batch): " + "; ".join(DRIFT),
        RuntimeWarning,
        stacklevel=1,
    )

_decode = msgspec.json.Decoder(Union[tuple(_EVENT_MODELS)]).decode  # type: ignore[misc]  # noqa: UP007
_encode = msgspec.json.Encoder().encode
_to_builtins = msgspec.to_builtins


# -- checks msgspec cannot express ----------------------------------------------------------

# Free-form objects (the only places of unbounded nesting) nest at most this deep: far
# below pydantic's JSON depth limit (a value about 200 levels deep is not JSON to it).
_MAX_DEPTH = 64


def _utf8_ok(value: str | UnsetType, limit: int) -> bool:
    """``Utf8MaxBytes(limit)``: at most ``limit`` bytes of UTF-8 (characters checked by Meta)."""
    if value is UNSET:
        return True
    assert isinstance(value, str)
    return len(value) * 4 <= limit or len(value.encode("utf-8")) <= limit


def _usage_ok(usage: _Usage | UnsetType) -> bool:
    """``Usage``'s rules: an estimate carries no cost/currency; confidence only on one."""
    if usage is UNSET:
        return True
    assert isinstance(usage, _Usage)
    if usage.estimated is True:
        return usage.cost is UNSET and usage.currency is UNSET
    return usage.confidence is UNSET


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


def _check_agent_started(data: Any) -> bool:
    return data.limits is UNSET or _storable(data.limits)


def _check_provider_turn(data: Any) -> bool:
    return _usage_ok(data.usage)


def _check_budget_exhausted(data: Any) -> bool:
    return _storable(data.counters)


def _check_usage_recorded(data: Any) -> bool:
    if data.scope == "provider_turn":
        if data.turn is UNSET or data.attempt is UNSET:
            return False
    elif data.turn is not UNSET or data.attempt is not UNSET:
        return False
    return _usage_ok(data.usage)


def _check_agent_finished(data: Any) -> bool:
    return _utf8_ok(data.stop_detail, STOP_DETAIL_MAX_BYTES)


def _check_error_message(data: Any) -> bool:
    return _utf8_ok(data.error.message, ERROR_MESSAGE_MAX_BYTES)


# The checks of each payload mirror that has any, by the mirror's class.
_CHECKS: dict[type[Struct], Callable[[Any], bool]] = {
    _AgentStartedData: _check_agent_started,
    _ProviderTurnFinishedData: _check_provider_turn,
    _BudgetExhaustedData: _check_budget_exhausted,
    _ChildFailedData: _check_error_message,
    _UsageRecordedData: _check_usage_recorded,
    _AgentFinishedData: _check_agent_finished,
    _ErrorEventData: _check_error_message,
}

# RFC3339_PATTERN's forms as pydantic (speedate) reads them: any number of fraction digits
# (truncated to microseconds), t/T, z/Z, offsets up to +-23:59 (-00:00 is UTC). The
# fixed-width part is read by position; its digits are ASCII ([0-9], not \d).
_TS = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}"
    r"(?:\.([0-9]+))?([Zz]|[+-][0-9]{2}:[0-9]{2})"
).fullmatch
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
_TS_MAX_US = (TS_MAX.date().toordinal() - _EPOCH_ORDINAL) * 86_400_000_000
assert TS_MIN.date().toordinal() == _EPOCH_ORDINAL and TS_MAX.time().isoformat() == "00:00:00"
_FRACTION_SCALE = (0, 100_000, 10_000, 1_000, 100, 10, 1)
_minute_us: dict[str, int] = {}  # "YYYY-MM-DDTHH:MM" -> its microseconds (before the offset)
_offset_us: dict[str, int] = {}  # "Z", "+01:00"... -> the offset in microseconds
_CACHE_MAX = 4096


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


def _ts_us(ts: str) -> int | None:
    """``to_us`` of the datetime pydantic makes of ``ts``; ``None`` (decline) if in doubt."""
    m = _TS(ts)
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
    if frac:  # truncated to microseconds, as pydantic does
        us += int(frac) * _FRACTION_SCALE[len(frac)] if len(frac) <= 6 else int(frac[:6])
    return us if 0 <= us < _TS_MAX_US else None


def _no_duplicates(raw: bytes, ev: _Env) -> bool:
    """Whether ``raw`` has no duplicate key anywhere (pydantic and msgspec keep the last one).

    Every key of ``raw`` is a field of the mirrors or a key of a free-form object (unknown
    keys decline), so re-encoding ``ev`` writes every key once. Outside strings a colon
    only follows a key; inside strings each literal colon decodes to one colon, which is
    re-encoded literally (the caller declines ``\\u003a`` escapes). So both texts hold the
    same number of colons exactly when no key was dropped as a duplicate.
    """
    return raw.count(b":") == _encode(ev).count(b":")


def _envelope(ev: _Env) -> dict[str, Any]:
    """``envelope_values``: its keys in its order, absent values left out."""
    env: dict[str, Any] = {}
    if ev.tenant_id is not UNSET:
        env["tenant_id"] = ev.tenant_id
    if ev.account_id is not UNSET:
        env["account_id"] = ev.account_id
    if ev.user_id is not UNSET:
        env["user_id"] = ev.user_id
    if ev.session_id is not UNSET:
        env["session_id"] = ev.session_id
    agent = ev.agent
    if agent is not UNSET:
        assert isinstance(agent, _AgentRef)
        env["agent_id"] = agent.id
        if agent.definition_revision is not UNSET:
            env["agent_definition_revision"] = agent.definition_revision
    model = ev.model
    if model is not UNSET:
        assert isinstance(model, _ModelRef)
        env["provider"] = model.provider
        env["model"] = model.model
    parent = ev.parent
    if parent is not UNSET:
        assert isinstance(parent, _ParentRef)
        env["parent_run_id"] = parent.run_id
        env["delegation_id"] = parent.delegation_id
        if parent.child_id is not UNSET:
            env["child_id"] = parent.child_id
    if ev.bundle_digest is not UNSET:
        env["bundle_digest"] = ev.bundle_digest
    return env


def _fast_one(raw: bytes) -> FastEvent | None:
    """The value as a ``FastEvent``, or ``None`` to decline (caller checked type and size)."""
    if b"\\u003" in raw:  # an escaped ':' would break the duplicate-key count
        return None
    try:
        ev = _decode(raw)
        data = ev.data  # type: ignore[attr-defined]
        check = _CHECKS.get(type(data))
        if check is not None and not check(data):
            return None
        ts_us = _ts_us(ev.ts)
        if ts_us is None or not _no_duplicates(raw, ev):
            return None
        return FastEvent(
            ev.event_id,
            ev.run_id,
            ev.seq,
            _TYPE_OF[type(ev)],
            ts_us,
            _to_builtins(data),
            _envelope(ev),
        )
    except Exception:  # any refusal (or surprise) declines
        return None


def parse_fast_batch(
    values: Sequence[bytes | None], max_bytes: int = MAX_EVENT_BYTES
) -> list[FastEvent | EventBase | ContractViolation]:
    """Each value as a ``FastEvent`` when the fast path accepts it, else what ``parse_batch``
    returns for it (one ``parse_batch`` call for all declined values; order kept).

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
    fast = not DRIFT
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for raw in values:
            result = (
                _fast_one(raw) if fast and type(raw) is bytes and len(raw) <= max_bytes else None
            )
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
