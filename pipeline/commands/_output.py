"""How commands print rows: an aligned table, one block per row, CSV, JSON, or a Parquet file.

Tables are for people: with ``human=True`` whole numbers get thousands separators and
money (``Decimal``) is rounded to 6 decimals, right-aligned. CSV and JSON are exact: a
``Decimal`` is printed as stored (never through a float). Parquet keeps types: decimals as
``decimal128(38, 12)``, whole numbers as int64, dates and times as such.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from datetime import date, datetime
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path
from typing import Any

__all__ = ["render", "write_parquet"]

_MONEY = Decimal("0.000001")


def render(
    columns: Sequence[str], rows: Sequence[Sequence[Any]], fmt: str, *, human: bool = False
) -> str:
    """Rows as an aligned ``table``, ``vertical`` blocks, ``csv`` with a header, or ``json``."""
    if fmt == "json":
        objects = [dict(zip(columns, row, strict=True)) for row in rows]
        return json.dumps(objects, default=_json_value, ensure_ascii=False, indent=2)
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([[_text(v, null="") for v in row] for row in rows])
        return out.getvalue().rstrip("\n")
    count = f"({len(rows)} row{'s' if len(rows) != 1 else ''})"
    if fmt == "vertical":
        return _vertical(columns, rows, human) + ("\n\n" if rows else "") + count
    if fmt != "table":
        raise ValueError(f"unknown output format {fmt!r}")
    cells = [[_cell(v, human) for v in row] for row in rows]
    right = [
        human and any(_numeric(row[i]) for row in rows) and all(
            _numeric(row[i]) or row[i] is None for row in rows
        )
        for i in range(len(columns))
    ]  # fmt: skip
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(w) if r else v.ljust(w) for v, w, r in zip(values, widths, right, strict=True)
        ]
        return "  ".join(parts).rstrip()

    lines = [line(list(columns)), "  ".join("-" * w for w in widths)]
    lines += [line(r) for r in cells]
    lines.append(count)
    return "\n".join(lines)


def write_parquet(columns: Sequence[str], rows: Sequence[Sequence[Any]], path: str | Path) -> None:
    """Write the rows to a Parquet file with exact types (see the module docstring)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if len(set(columns)) != len(columns):
        raise ValueError(f"columns {list(columns)} repeat a name; Parquet needs unique names")
    arrays = []
    for i in range(len(columns)):
        values = [row[i] for row in rows]
        present = [v for v in values if v is not None]
        if present and all(isinstance(v, Decimal) for v in present):
            arrays.append(pa.array(values, type=pa.decimal128(38, 12)))
        elif present and all(isinstance(v, int) and not isinstance(v, bool) for v in present):
            arrays.append(pa.array(values, type=pa.int64()))
        elif not present:
            arrays.append(pa.array(values, type=pa.string()))
        else:
            try:
                arrays.append(pa.array(values))
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                arrays.append(pa.array([_text(v, null="") if v is not None else None
                                        for v in values], type=pa.string()))  # fmt: skip
    pq.write_table(pa.table(arrays, names=list(columns)), str(path))


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, Decimal, float)) and not isinstance(value, bool)


def _cell(value: Any, human: bool) -> str:
    if human and isinstance(value, Decimal):
        return f"{value.quantize(_MONEY, rounding=ROUND_HALF_EVEN):,}"
    if human and isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return _text(value)


def _vertical(columns: Sequence[str], rows: Sequence[Sequence[Any]], human: bool) -> str:
    width = max((len(c) for c in columns), default=0)
    blocks = []
    for n, row in enumerate(rows, 1):
        title = f"Row {n}:"
        body = [f"{c.rjust(width)}: {_cell(v, human)}" for c, v in zip(columns, row, strict=True)]
        blocks.append("\n".join([title, "-" * len(title), *body]))
    return "\n\n".join(blocks)


def _text(value: Any, null: str = "NULL") -> str:
    if value is None:
        return null
    if isinstance(value, Decimal):
        return format(value, "f")  # never 1E-12
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="backslashreplace")
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, default=_json_value, ensure_ascii=False)
    return str(value)


def _json_value(value: Any) -> Any:
    if isinstance(value, Decimal):
        return format(value, "f")  # exact: a float would round money; never 1E-12
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="backslashreplace")
    raise TypeError(f"cannot print a {type(value).__name__} as JSON: {value!r}")
