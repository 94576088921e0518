"""Offline expansion of a ClickHouse-plugin query, the way Grafana and the plugin do it.

A dashboard query goes through three steps before it reaches ClickHouse, and
``expand_query`` replays them in order:

1. the plugin's frontend ``applyConditionalAll``: ``$__conditionalAll(cond, $var)`` becomes
   ``1=1`` when ``$var`` is All (``$__all``) or empty, else ``cond``;
2. Grafana's template service: ``$var``, ``${var}``, ``${var:format}`` and ``[[var]]``;
   a variable without an explicit format uses the plugin's formatter (a list becomes
   ``'a','b'``, a single value stays raw), All becomes every option's value (or the
   variable's custom all value, unformatted); unknown names are left as they are. The
   formats are Grafana's own, escaping included: ``singlequote`` and ``sqlstring`` leave
   ``\\`` alone (so they cannot protect a ClickHouse literal); ``percentencode`` is
   ``encodeURIComponent`` plus ``!'()*``;
3. the plugin's backend macros (sqlds): ``$__timeFilter(col)`` ->
   ``col >= toDateTime(<from s>) AND col <= toDateTime(<to s>)``, ``$__timeFilter_ms(col)``
   -> the same with ``fromUnixTimestamp64Milli(<ms>)``, ``$__fromTime``/``$__toTime``
   (``_ms``), ``$__dateFilter(col)``, ``$__dateTimeFilter(d, t)`` (``$__dt``),
   ``$__timeInterval(col)`` -> ``toStartOfInterval(toDateTime(col), INTERVAL <n> second)``,
   ``$__timeInterval_ms(col)`` and ``$__interval_s``; the interval is at least 1 s.

Alert rules skip steps 1 and 2 (Grafana evaluates them on the server, without a
dashboard): ``expand_alert_query`` applies step 3 only, and refuses template variables.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from urllib.parse import quote

from prism.dashboards._errors import MacroError

__all__ = [
    "ALERT_MACROS",
    "ALL",
    "TimeRange",
    "Variable",
    "apply_conditional_all",
    "expand_alert_query",
    "expand_backend_macros",
    "expand_query",
    "replace_variables",
]

ALL = "$__all"

# Grafana's TemplateSrv variable syntax: $name, [[name:fmt]], ${name.field:fmt}
_VARIABLE_RE = re.compile(
    r"\$(\w+)|\[\[(\w+?)(?::(\w+))?\]\]|\$\{(\w+)(?:\.([^:^}]+))?(?::([^}]+))?\}"
)


@dataclass(frozen=True)
class TimeRange:
    """The dashboard time range and the panel interval (``$__interval``) of one query run."""

    start: datetime
    end: datetime
    interval: timedelta = timedelta(seconds=60)

    def __post_init__(self) -> None:
        for name in ("start", "end"):
            value = getattr(self, name)
            if value.tzinfo is None:
                raise MacroError(
                    f"TimeRange.{name}={value!r} has no time zone; pass an aware datetime "
                    "(e.g. datetime(..., tzinfo=UTC))"
                )
        if self.end < self.start:
            raise MacroError(f"TimeRange ends ({self.end}) before it starts ({self.start})")

    @property
    def from_s(self) -> int:
        return int(self.start.timestamp() // 1)

    @property
    def to_s(self) -> int:
        return int(self.end.timestamp() // 1)

    @property
    def from_ms(self) -> int:
        return _epoch_ms(self.start)

    @property
    def to_ms(self) -> int:
        return _epoch_ms(self.end)

    @property
    def interval_s(self) -> int:
        return max(int(self.interval.total_seconds()), 1)

    @property
    def interval_ms(self) -> int:
        return max(self.interval // timedelta(milliseconds=1), 1)


def _epoch_ms(value: datetime) -> int:
    return (value - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)


@dataclass(frozen=True)
class Variable:
    """A dashboard template variable's current state.

    ``value`` is a string, or a list for a multi-value variable; All is ``ALL`` (or
    ``[ALL]``). ``options`` are the values All stands for; ``all_value`` is the variable's
    custom all value, if it has one.

    Example::

        Variable("tenant", [ALL], options=("acme", "globex"))
        Variable("tenant", ["acme"])
        Variable("run_id", "run-42")
    """

    name: str
    value: str | list[str]
    options: Sequence[str] = field(default_factory=tuple)
    all_value: str | None = None

    @property
    def is_all(self) -> bool:
        values = self.value if isinstance(self.value, list) else [self.value]
        return ALL in values

    @property
    def js_string(self) -> str:
        """The value as JavaScript's ``String(value)`` would print it (lists join with ',')."""
        return ",".join(self.value) if isinstance(self.value, list) else self.value


def _split_args(sql: str, open_paren: int) -> tuple[list[str], int]:
    """Arguments of the call whose '(' is at ``open_paren``, split on commas at depth 1
    (the plugin's ``getMacroArgs``), and the index just past the closing ')'."""
    depth = 0
    args: list[str] = []
    start = open_paren + 1
    for i in range(open_paren, len(sql)):
        ch = sql[i]
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                args.append(sql[start:i])
                return args, i + 1
        elif ch == "," and depth == 1:
            args.append(sql[start:i])
            start = i + 1
    raise MacroError(
        f"unbalanced parentheses in a macro call at offset {open_paren}: "
        f"{sql[open_paren : open_paren + 60]!r}...; close every '('"
    )


def apply_conditional_all(sql: str, variables: Mapping[str, Variable]) -> str:
    """Step 1: the plugin frontend's ``$__conditionalAll(condition, $var)``."""
    macro = "$__conditionalAll("
    index = sql.rfind(macro)
    while index != -1:
        args, end = _split_args(sql, index + len(macro) - 1)
        if len(args) != 2:
            raise MacroError(
                f"$__conditionalAll takes (condition, $variable), got {len(args)} "
                f"argument(s): {sql[index:end]!r}"
            )
        condition, ref = args[0], args[1].strip()
        name = ref[1:]
        if not ref.startswith("$") or name not in variables:
            raise MacroError(
                f"$__conditionalAll's second argument {ref!r} names no variable among "
                f"{sorted(variables)}; write it as $name (the plugin looks the name up "
                "without braces, so ${name} never short-circuits)"
            )
        var = variables[name]
        phrase = "1=1" if var.js_string in ("", ALL) else condition
        sql = sql[:index] + phrase + sql[end:]
        index = sql.rfind(macro)
    return sql


def _encode_uri_component_strict(text: str, name: str) -> str:
    """JavaScript's ``encodeURIComponent`` plus ``!'()*`` (Grafana's ``percentencode``)."""
    try:
        return quote(text.encode("utf-8"), safe="")
    except UnicodeEncodeError:  # a lone surrogate: encodeURIComponent throws URIError
        raise MacroError(
            f"${{{name}:percentencode}}: the value {text!r} is not valid Unicode; Grafana's "
            "encodeURIComponent would throw"
        ) from None


def _format_value(value: str | list[str], fmt: str | None, name: str) -> str:
    """Grafana's variable formats; ``None`` is the ClickHouse plugin's own formatter."""
    values = value if isinstance(value, list) else [value]
    if fmt is None:
        return "'" + "','".join(value) + "'" if isinstance(value, list) else value
    if fmt == "percentencode":  # a list is written like a glob, {a,b}, then encoded
        text = "{" + ",".join(value) + "}" if isinstance(value, list) else value
        return _encode_uri_component_strict(text, name)
    if fmt == "singlequote":
        return ",".join("'" + v.replace("'", "\\'") + "'" for v in values)
    if fmt == "doublequote":
        return ",".join('"' + v.replace('"', '\\"') + '"' for v in values)
    if fmt == "sqlstring":  # Grafana: ' doubled, " backslash-escaped, \ left alone
        return ",".join("'" + v.replace("'", "''").replace('"', '\\"') + "'" for v in values)
    if fmt == "csv":
        return ",".join(values)
    if fmt == "pipe":
        return "|".join(values)
    if fmt == "raw":
        return ",".join(values)
    raise MacroError(
        f"unsupported variable format {fmt!r} in ${{{name}:{fmt}}}; use one of "
        "percentencode, singlequote, doublequote, sqlstring, csv, pipe, raw"
    )


def _builtin_variables(time_range: TimeRange) -> dict[str, str]:
    return {
        "__from": str(time_range.from_ms),
        "__to": str(time_range.to_ms),
        "__interval": f"{time_range.interval_s}s",
        "__interval_ms": str(time_range.interval_ms),
        "__range_s": str(time_range.to_s - time_range.from_s),
        "__range_ms": str(time_range.to_ms - time_range.from_ms),
    }


def replace_variables(
    sql: str, variables: Mapping[str, Variable], time_range: TimeRange | None = None
) -> str:
    """Step 2: Grafana's template service with the plugin's default formatter."""
    builtins = _builtin_variables(time_range) if time_range is not None else {}

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2) or match.group(4)
        fmt = match.group(3) or match.group(6)
        if name in builtins:
            return builtins[name]
        var = variables.get(name)
        if var is None:
            return match.group(0)
        if var.is_all:
            if var.all_value is not None:
                return var.all_value
            return _format_value(list(var.options), fmt, name)
        return _format_value(var.value, fmt, name)

    return _VARIABLE_RE.sub(substitute, sql)


def _to_datetime(seconds: int) -> str:
    return f"toDateTime({seconds})"


def _to_datetime64(ms: int) -> str:
    return f"fromUnixTimestamp64Milli({ms})"


def _date(value: datetime) -> str:
    return f"toDate('{value.astimezone(UTC):%Y-%m-%d}')"


def _one_arg(name: str, args: list[str]) -> str:
    if len(args) != 1 or not args[0]:
        raise MacroError(f"$__{name} expects 1 argument, received {len(args)}: {args!r}")
    return args[0]


def _macro_table(tr: TimeRange) -> dict[str, Callable[[list[str]], str]]:
    def time_filter(args: list[str]) -> str:
        col = _one_arg("timeFilter", args)
        return f"{col} >= {_to_datetime(tr.from_s)} AND {col} <= {_to_datetime(tr.to_s)}"

    def time_filter_ms(args: list[str]) -> str:
        col = _one_arg("timeFilter_ms", args)
        return f"{col} >= {_to_datetime64(tr.from_ms)} AND {col} <= {_to_datetime64(tr.to_ms)}"

    def date_filter(args: list[str]) -> str:
        col = _one_arg("dateFilter", args)
        return f"{col} >= {_date(tr.start)} AND {col} <= {_date(tr.end)}"

    def date_time_filter(args: list[str]) -> str:
        if len(args) != 2:
            raise MacroError(f"$__dateTimeFilter expects 2 arguments, received {len(args)}")
        d, t = args
        return (
            f"({d} >= {_date(tr.start)} AND {d} <= {_date(tr.end)}) AND "
            f"({t} >= {_to_datetime(tr.from_s)} AND {t} <= {_to_datetime(tr.to_s)})"
        )

    def time_interval(args: list[str]) -> str:
        col = _one_arg("timeInterval", args)
        return f"toStartOfInterval(toDateTime({col}), INTERVAL {tr.interval_s} second)"

    def time_interval_ms(args: list[str]) -> str:
        col = _one_arg("timeInterval_ms", args)
        return f"toStartOfInterval(toDateTime64({col}, 3), INTERVAL {tr.interval_ms} millisecond)"

    return {
        "fromTime": lambda _: _to_datetime(tr.from_s),
        "toTime": lambda _: _to_datetime(tr.to_s),
        "fromTime_ms": lambda _: _to_datetime64(tr.from_ms),
        "toTime_ms": lambda _: _to_datetime64(tr.to_ms),
        "timeFilter": time_filter,
        "timeFilter_ms": time_filter_ms,
        "dateFilter": date_filter,
        "dateTimeFilter": date_time_filter,
        "dt": date_time_filter,
        "timeInterval": time_interval,
        "timeInterval_ms": time_interval_ms,
        "interval_s": lambda _: str(tr.interval_s),
    }


# Macros the plugin's backend expands; the only ones an alert rule may use.
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
ALERT_MACROS = frozenset(_macro_table(TimeRange(_EPOCH, _EPOCH)))

# sqlds: ``\$__name\b(?:\((.*?)\))?``; arguments end at the first ')' and split on every ','.
_MACRO_RE = re.compile(r"\$__(\w+)\b(?:\(([^)]*)\))?")


def expand_backend_macros(sql: str, time_range: TimeRange) -> str:
    """Step 3: the plugin backend's macros; unknown ``$__name`` stays as it is.

    Arguments follow sqlds: they end at the first ``)`` and split on every comma, so an
    argument must be a plain column (an expression with parentheses or commas is refused).
    """
    table = _macro_table(time_range)

    def substitute(match: re.Match[str]) -> str:
        name, raw = match.group(1), match.group(2)
        if name not in table:
            return match.group(0)
        if raw is None:
            return table[name]([])
        if "(" in raw:
            raise MacroError(
                f"{match.group(0)!r}: the plugin's backend ends macro arguments at the first "
                "')', so pass a plain column, not an expression; alias the expression in a "
                "subquery and filter on the alias"
            )
        return table[name]([a.strip() for a in raw.split(",")])

    return _MACRO_RE.sub(substitute, sql)


def expand_query(
    sql: str, time_range: TimeRange, variables: Mapping[str, Variable] | Sequence[Variable] = ()
) -> str:
    """A dashboard query as ClickHouse receives it (steps 1, 2 and 3).

    Example::

        >>> tr = TimeRange(datetime(2024, 1, 1, tzinfo=UTC), datetime(2024, 1, 2, tzinfo=UTC))
        >>> expand_query("WHERE $__conditionalAll(t IN (${tenant:singlequote}), $tenant) "
        ...              "AND $__timeFilter_ms(ts)", tr, [Variable("tenant", ["acme"])])
        "WHERE t IN ('acme') AND ts >= fromUnixTimestamp64Milli(1704067200000) AND ..."
    """
    by_name = dict(variables) if isinstance(variables, Mapping) else {v.name: v for v in variables}
    sql = apply_conditional_all(sql, by_name)
    sql = replace_variables(sql, by_name, time_range)
    return expand_backend_macros(sql, time_range)


def expand_alert_query(sql: str, time_range: TimeRange) -> str:
    """An alert-rule query as ClickHouse receives it: backend macros only.

    Raises ``MacroError`` when the SQL uses a template variable or a frontend-only macro,
    which Grafana's alert evaluation would send to ClickHouse unexpanded.
    """
    for match in _VARIABLE_RE.finditer(sql):
        name = match.group(1) or match.group(2) or match.group(4)
        if name.startswith("__") and name[2:] in ALERT_MACROS:
            continue
        raise MacroError(
            f"alert query uses {match.group(0)!r}, which Grafana does not expand when it "
            f"evaluates alert rules; use only the backend macros {sorted(ALERT_MACROS)}"
        )
    return expand_backend_macros(sql, time_range)
