"""The fast path's tables are the pydantic models' own, not a second copy.

1. Property: events of every type, generated from each class's JSON Schema (valid, mutated
   at one node, or broken at the text level with rule 13's hostile values), parse the same
   on both paths: the fast path declines, or returns exactly what pydantic returns; it
   never accepts what pydantic rejects.
2. Changing a bound, literal set, pattern or byte cap on a model (and rebuilding it) changes
   the fast path the same way, and tables made before the change would be caught by the
   differential check.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Annotated, Any, Literal, Union

import msgspec
import pytest
from annotated_types import Le
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import (
    AfterValidator,
    BaseModel,
    Field,
    StringConstraints,
    TypeAdapter,
    ValidationError,
)

from prism.schemas import (
    KNOWN_EVENT_CLASSES,
    MAX_SAFE_INTEGER,
    AgentDenied,
    Budgets,
    DeterministicTurnFinishedData,
    ErrorInfo,
    EventBase,
    FastEvent,
    GuardrailDeniedData,
    _data,
    _fast,
    _payloads,
    parse_batch,
    parse_fast_batch,
)
from prism.schemas._fast import TABLES, Tables, build_tables
from prism.schemas._types import Utf8MaxBytes
from tests.unit.test_fast_parse import assert_same, check, dup_text, enc, seed_of, with_path


def type_of(cls: Any) -> str:
    return cls.model_fields["type"].annotation.__args__[0]  # type: ignore[no-any-return]


TYPES = [type_of(cls) for cls in KNOWN_EVENT_CLASSES]
SCHEMAS = {t: cls.model_json_schema() for t, cls in zip(TYPES, KNOWN_EVENT_CLASSES, strict=True)}
PROPS = settings(
    max_examples=400, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)

# -- events from the JSON Schema ------------------------------------------------------------

HOSTILE: list[Any] = [
    2**53,
    -(2**53),
    2**63,
    2**64,
    10**30,
    -1,
    1e308,
    -0.0,
    5e-324,
    "",
    "\x00",
    "\x1f\x7f",
    "\u2028",
    "😀" * 300,
    "é" * 1025,
    "x" * 1025,
    "other",
    True,
    None,
    [],
    {},
    [[[[[[1]]]]]],
]
texts = st.text(st.characters(codec="utf-8"), max_size=12) | st.sampled_from(
    ["", "x", "é", "😀", "a:b", "\\", '"', "NaN", "Infinity"]
)
free_form = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts
    | st.sampled_from(HOSTILE),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)
plausible_ts = st.builds(
    lambda moment, frac, zone: f"{moment:%Y-%m-%dT%H:%M:%S}{frac}{zone}",
    st.datetimes(min_value=datetime(1969, 12, 31), max_value=datetime(2200, 1, 1, 23)),
    st.sampled_from(["", ".5", ".123456", ".1234567"]),
    st.sampled_from(["Z", "z", "+00:00", "-00:00", "+05:30", "-23:59", "+24:00"]),
)


def resolve(node: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = root["$defs"][node["$ref"].rsplit("/", 1)[1]]
    return node


def number(data: st.DataObject, node: dict[str, Any], integer: bool) -> Any:
    lo = node.get("minimum", -MAX_SAFE_INTEGER)
    hi = node.get("maximum", node.get("exclusiveMaximum", MAX_SAFE_INTEGER))
    hi = int(hi) if integer else hi
    edges = [
        v for v in (lo, hi, lo + 1, hi - 1) if lo <= v <= hi and v != node.get("exclusiveMaximum")
    ]
    if integer:
        return data.draw(
            st.sampled_from(edges) | st.integers(lo, min(hi, lo + 1000)) | st.integers(lo, hi)
        )
    exclusive = "exclusiveMaximum" in node
    floats = st.floats(lo, hi, exclude_max=exclusive, allow_nan=False, allow_subnormal=True)
    return data.draw(st.sampled_from(edges) | floats | st.integers(int(lo), int(min(hi, 10**6))))


def string(data: st.DataObject, node: dict[str, Any]) -> str:
    if node.get("format") == "date-time":
        return data.draw(plausible_ts)
    if "pattern" in node:
        return data.draw(st.from_regex(node["pattern"], fullmatch=True))
    lo, hi = node.get("minLength", 0), node.get("maxLength")
    if hi is not None and data.draw(st.booleans()):  # at the cap, in 1..4-byte characters
        return data.draw(st.sampled_from("xé€😀")) * data.draw(
            st.sampled_from([hi, hi // 2, hi // 4])
        )
    return data.draw(texts.filter(lambda s: len(s) >= lo and (hi is None or len(s) <= hi)))


def valid(
    data: st.DataObject,
    node: dict[str, Any],
    root: dict[str, Any],
    nulls: bool,
    at: tuple[Any, ...] = (),
    nodes: dict[tuple[Any, ...], Any] | None = None,
) -> Any:
    """A value of ``node`` (within its bounds; optional fields absent, present or null);
    ``nodes`` gets the schema node of every path drawn."""
    node = resolve(node, root)
    if nodes is not None:
        nodes[at] = node
    if "const" in node:
        return node["const"]
    if "enum" in node:
        return data.draw(st.sampled_from(node["enum"]))
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        return valid(data, data.draw(st.sampled_from(options)), root, nulls, at, nodes)
    kind = node.get("type")
    if kind in ("integer", "number"):
        return number(data, node, kind == "integer")
    if kind == "string":
        return string(data, node)
    if kind == "boolean":
        return data.draw(st.booleans())
    if kind == "array":
        size = data.draw(st.integers(0, node.get("maxItems", 3)))
        item = node.get("items", {})
        return [valid(data, item, root, nulls, (*at, i), nodes) for i in range(size)]
    if kind == "object" and "properties" in node:
        out: dict[str, Any] = {}
        required = set(node.get("required", ()))
        for key, sub in node["properties"].items():
            roll = data.draw(
                st.sampled_from(["in", "in", "out", "null"] if nulls else ["in", "out"])
            )
            if key in required or roll == "in":
                out[key] = valid(data, sub, root, nulls, (*at, key), nodes)
            elif roll == "null":
                out[key] = None
        return out
    return data.draw(free_form)


def paths(value: Any, here: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, sub in items:
        yield (*here, key)
        yield from paths(sub, (*here, key))


def near_misses(node: dict[str, Any], root: dict[str, Any], value: Any) -> list[Any]:
    """Values just outside ``node``'s bounds, literal set, length or pattern."""
    node = resolve(node, root)
    out: list[Any] = []
    for option in node.get("anyOf", ()):
        out += near_misses(option, root, value) if option.get("type") != "null" else []
    text = value if isinstance(value, str) and value else "x"
    if "const" in node or "enum" in node:
        out += ["high", "unknown_x", "prism.agent-event/v2", text + "\n", text.upper()]
    kind = node.get("type")
    if kind in ("integer", "number"):
        lo, hi = node.get("minimum"), node.get("maximum", node.get("exclusiveMaximum"))
        out += [e + d for e in (lo, hi) if e is not None for d in (-1, 1, -0.5, 0.5)]
        out += [2**64, "1"]
    if kind == "string":
        cap, least = node.get("maxLength"), node.get("minLength", 0)
        if cap is not None:
            out += ["x" * (cap + 1), "é" * (cap // 2 + 1), "😀" * (cap // 4 + 1)]
        if least:
            out += ["x" * (least - 1)]
        if "pattern" in node:
            out += [text + "\n", "\n" + text, text + "x", text[:-1], text.swapcase()]
        out += [5]
    if kind == "array" and isinstance(value, list):
        out += [value + [value[0] if value else "x"] * (node.get("maxItems", 3) + 1), [5]]
    return out


SHARP = ("enum", "const", "minimum", "maximum", "exclusiveMaximum", "Length", "pattern", "maxItems")


def constrained(node: dict[str, Any]) -> bool:
    """Whether a (leaf or array) node carries a literal set, bound, length or pattern."""
    if node.get("type") == "object":
        return False
    text = json.dumps(node)
    return any(key in text for key in SHARP)


def _walk_enums(node: Any) -> Iterator[Any]:
    if isinstance(node, dict):
        yield from node.get("enum", ())
        if "const" in node:
            yield node["const"]
        for sub in node.values():
            yield from _walk_enums(sub)
    elif isinstance(node, list):
        for sub in node:
            yield from _walk_enums(sub)


ENUMS = sorted(
    {v for s in SCHEMAS.values() for v in _walk_enums(s) if isinstance(v, str)}
    | {"high", "unknown_x"}
)


def replaced(event: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    event = json.loads(json.dumps(event))
    json_get(event, path[:-1])[path[-1]] = value
    return event


def mutated(data: st.DataObject, event: dict[str, Any]) -> dict[str, Any]:
    """``event`` with one node replaced by a hostile value, dropped, duplicated under its
    snake_case name, or joined by an unknown key."""
    path = data.draw(st.randoms()).choice(list(paths(event)))  # uniform, unlike sampled_from
    event = json.loads(json.dumps(event))
    parent = json_get(event, path[:-1])
    key = path[-1]
    op = data.draw(st.sampled_from(["hostile", "drop", "rename", "extra"]))
    if op == "hostile" or isinstance(parent, list):
        parent[key] = data.draw(st.sampled_from(HOSTILE) | free_form)
    elif op == "drop":
        parent.pop(key)
    elif op == "rename":
        parent[re.sub("([A-Z])", r"_\1", key).lower() + data.draw(st.sampled_from(["", "_"]))] = (
            parent.pop(key)
        )
    else:
        parent[data.draw(texts)] = data.draw(free_form)
    return event


def broken(data: st.DataObject, raw: bytes, event: dict[str, Any]) -> bytes:
    """``raw`` with rule 13's hostile text: NaN/Infinity, a lone surrogate, bytes that are
    not UTF-8, control characters, a huge integer, deep nesting or a duplicate key."""
    op = data.draw(st.sampled_from(["token", "key", "nest"]))
    if op == "key":
        objects = [
            p for p in paths(event) if isinstance(json_get(event, p), dict) and json_get(event, p)
        ]
        at = data.draw(st.sampled_from([(), *objects]))
        obj = json_get(event, at)
        key = data.draw(st.sampled_from(sorted(obj)))
        return dup_text(
            event, at, key, obj[key] if data.draw(st.booleans()) else 0, data.draw(st.booleans())
        )
    if op == "nest":
        depth = data.draw(st.sampled_from([63, 64, 65, 199, 200, 1000]))
        return raw.replace(b"{", b'{"deep":' + b"[" * depth + b"]" * depth + b",", 1)
    token = data.draw(
        st.sampled_from(
            [
                b"NaN",
                b"Infinity",
                b"-Infinity",
                b"\\ud800",
                b"\\udfff",
                b"\xff",
                b"\xed\xa0\x80",
                b"\xc0\xaf",
                b"\x00",
                b"\x1f",
                b"9" * 400,
                b"1e400",
                b"\\u0000",
                b"\\u003a",
            ]
        )
    )
    at = data.draw(st.integers(0, len(raw)))
    return raw[:at] + token + raw[at:]


def json_get(value: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        value = value[step]
    return value


# -- 1. both paths agree on every input ----------------------------------------------------------


MODES = ["valid", "null", "near", "mutated", "text"]


@PROPS
@given(st.sampled_from(TYPES), st.sampled_from(MODES), st.data())
def test_fast_and_pydantic_agree_on_generated_events(
    type_: str, how: str, data: st.DataObject
) -> None:
    """For every input the fast path declines, or gives exactly pydantic's event."""
    root = SCHEMAS[type_]
    nodes: dict[tuple[Any, ...], Any] = {}
    event = valid(data, root, root, nulls=how == "null", nodes=nodes)
    for _ in range(4):  # a base the fast path takes, so the change alone decides
        if how in ("valid", "null") or parse_fast_batch([enc(event)])[0].__class__ is FastEvent:
            break
        nodes.clear()
        event = valid(data, root, root, nulls=False, nodes=nodes)
    if how == "near":  # every near miss of every constrained node, one at a time
        for path in paths(event):
            if path in nodes and constrained(nodes[path]):
                for value in near_misses(nodes[path], root, json_get(event, path)):
                    check(enc(replaced(event, path, value)))
        return
    if how == "mutated":
        event = mutated(data, event)
    raw = enc(event)
    if how == "text":
        raw = broken(data, raw, event)
    check(raw)  # declined (and parse_batch's result), or equal to pydantic's event


def test_generated_valid_events_take_the_fast_path() -> None:
    """The property above is not vacuous: most valid events of every type are accepted."""
    taken: Counter[str] = Counter()
    valid_of: Counter[str] = Counter()

    @settings(
        max_examples=10, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(st.data())
    def draw(data: st.DataObject) -> None:
        for type_ in TYPES:
            root = SCHEMAS[type_]
            for _ in range(10):  # the JSON Schema leaves the cross-field rules to allOf
                raw = enc(valid(data, root, root, nulls=False))
                if isinstance(parse_batch([raw])[0], EventBase):
                    valid_of[type_] += 1
                    taken[type_] += check(raw) is not None
                    break

    draw()
    print({t: f"{taken[t]}/{valid_of[t]}" for t in TYPES})
    assert {t for t in TYPES if taken[t] == 0} == set()


# -- 2. a changed model changes the fast path ------------------------------------------------------


def rebuild_models() -> None:
    """Rebuild every contract model's validator, leaves first, from its current fields."""
    for module in (_payloads, _data):
        for name in module.__all__:
            model = getattr(module, name)
            if isinstance(model, type) and issubclass(model, BaseModel):
                model.model_rebuild(force=True)
    for cls in KNOWN_EVENT_CLASSES:
        cls.model_rebuild(force=True)


@contextmanager
def changed(model: type[BaseModel], field: str, **attributes: Any) -> Iterator[None]:
    info = model.model_fields[field]
    saved = {name: getattr(info, name) for name in attributes}
    try:
        for name, value in attributes.items():
            setattr(info, name, value)
        rebuild_models()
        yield
    finally:
        for name, value in saved.items():
            setattr(info, name, value)
        rebuild_models()


def reference(raw: bytes) -> Any:
    """What pydantic makes of ``raw`` with the models as they are now (``None``: rejected)."""
    union = Annotated[Union[tuple(KNOWN_EVENT_CLASSES)], Field(discriminator="type")]  # type: ignore[misc]  # noqa: UP007
    try:
        return TypeAdapter(union).validate_json(raw)
    except ValidationError:
        return None


def struct_field(tables: Tables, type_: str, path: tuple[str, ...]) -> Any:
    """msgspec's view of the field at ``path`` of the event struct of ``type_``."""
    struct = next(s for s, m in tables.models.items() if type_of(m) == type_)
    info: Any = msgspec.inspect.type_info(struct)
    for name in path:  # an optional field's type is its value's (UNSET is not listed)
        info = next(f.type for f in info.fields if f.name == name)
    return info


CHANGES = [
    # (model, field, new attributes, event type, path to the field, value inside, value outside)
    (
        Budgets,
        "turns",
        {"metadata": [Le(100)]},
        "provider_turn_finished",
        ("data", "budgets", "turns"),
        100,
        101,
    ),
    (AgentDenied, "seq", {"metadata": [Le(5)]}, "agent_denied", ("seq",), 5, 6),
    (
        GuardrailDeniedData,
        "stage",
        {"annotation": Literal["input", "output"]},
        "guardrail_denied",
        ("data", "stage"),
        "input",
        "before_tool",
    ),
    (
        GuardrailDeniedData,
        "tool",
        {"annotation": Annotated[str, StringConstraints(min_length=1, max_length=8)] | None},
        "guardrail_denied",
        ("data", "tool"),
        "x" * 8,
        "x" * 9,
    ),
    (
        DeterministicTurnFinishedData,
        "middleware",
        {"metadata": [StringConstraints(pattern=r"^m-[0-9]{1,3}$")]},
        "deterministic_turn_finished",
        ("data", "middleware"),
        "m-123",
        "cache.semantic-hit",
    ),
    (
        ErrorInfo,
        "message",
        {"metadata": [Utf8MaxBytes(16)]},
        "error",
        ("data", "error", "message"),
        "é" * 8,
        "é" * 8 + "x",
    ),
]


@pytest.mark.parametrize("change", CHANGES, ids=lambda c: f"{c[0].__name__}.{c[1]}")
def test_a_changed_model_changes_the_fast_path(change: tuple[Any, ...]) -> None:
    model, field, attributes, type_, path, inside, outside = change
    key_path = tuple(_camel(p) if isinstance(p, str) else p for p in path)
    event = seed_of(type_)
    inside_raw = enc(with_path(event, key_path, inside))
    outside_raw = enc(with_path(event, key_path, outside))
    stale = TABLES
    before = struct_field(stale, type_, path)
    assert stale.accept(outside_raw) is not None  # today both paths take it
    with changed(model, field, **attributes):
        fresh = build_tables()
        assert fresh.declined == ()
        # the tables follow the model: the value outside it, which the tables made before
        # the change take, is declined now (a bound in msgspec's struct, a pattern in the
        # struct's Python check)
        for raw, taken in ((inside_raw, True), (outside_raw, False)):
            ref = reference(raw)
            assert (ref is not None) is taken
            fast = fresh.accept(raw)
            assert (fast is not None) is taken
            if fast is not None:
                assert_same(fast, ref)
        # Tables made before the change accept what the changed model rejects: the
        # differential check (parse_fast_batch against pydantic) would catch such drift.
        drifted = stale.accept(outside_raw)
        assert isinstance(drifted, FastEvent) and reference(outside_raw) is None
    restored = build_tables()
    assert struct_field(restored, type_, path) == before
    assert restored.accept(outside_raw) is not None  # the model is as it was again


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def test_the_rebuilt_models_are_the_originals_again() -> None:
    """The changes above are undone: the fast path and pydantic still agree on seeds."""
    with changed(Budgets, "turns", metadata=[Le(100)]):
        pass
    assert build_tables().declined == ()
    for type_ in TYPES:
        raw = enc(seed_of(type_))
        assert isinstance(parse_fast_batch([raw])[0], FastEvent)
        check(raw)


def test_a_pattern_remembers_what_matched_within_its_bound() -> None:
    """``_matching`` answers as ``re.search`` does, for values seen before or not, and
    remembers at most ``_MATCHED_MAX`` values per pattern."""
    pattern = r"\Ab-[0-9]+\Z"
    matches = _fast._matching(pattern)
    values = [f"b-{i}" for i in range(_fast._MATCHED_MAX + 10)]
    values += ["b-1\n", "b-", "a-1", "b-1x", "", "b-12"]
    for _ in range(2):  # the second time, many are remembered
        for value in values:
            assert matches(value) is (re.search(pattern, value) is not None), value
            assert len(_fast._MATCHED[pattern]) <= _fast._MATCHED_MAX
    assert "b-1\n" not in _fast._MATCHED[pattern]


def test_an_unknown_validator_declines_its_field_never_accepts() -> None:
    """A node the fast path does not reproduce (here a max length it is not told of, hidden
    in a validator) makes its values decline instead of passing unchecked."""

    def short(value: str) -> str:
        if len(value) > 3:
            raise ValueError("too long")
        return value

    new = Annotated[str, AfterValidator(short)] | None
    with changed(_data.AgentFinishedData, "finish_reason", annotation=new):
        fresh = build_tables()
        assert any("finish_reason" in d and "declined when present" in d for d in fresh.declined)
        base = seed_of("agent_finished")
        for reason in ("ok", "way too long"):
            raw = enc(with_path(base, ("data", "finishReason"), reason))
            assert fresh.accept(raw) is None
        raw = enc({**base, "data": {k: v for k, v in base["data"].items() if k != "finishReason"}})
        assert fresh.accept(raw) is not None  # absent: the rest of the type stays fast
