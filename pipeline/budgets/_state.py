"""The budget desk's stored state, with a format version: in one record (``to_bytes``),
or as a header plus one record per usage row (``state_writes``), for a compacted
changelog whose records must stay small however many rows the open periods hold.

Both carry the same header: the allowed lateness, expected lanes, watermark, settled time,
counts, fired thresholds (by scope id, so a budgets file may change between runs) and the
lanes' reports. A row is ``SpendRow.to_list()`` plus the time it counts from.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import localcontext
from typing import TYPE_CHECKING, Any

import orjson

from prism.pipeline.core import LaneReport

from ._config import Budgets
from ._errors import BudgetStateError
from ._spend import SpendRow

if TYPE_CHECKING:
    from ._desk import BudgetDesk

__all__ = ["ROW_PREFIX", "STATE_FORMAT", "STATE_KEY", "dump", "load", "load_records", "writes"]

STATE_FORMAT = 1  # the version of both forms
STATE_KEY = b"budget-desk"  # the header's key in a changelog
ROW_PREFIX = b"budget-desk:row:"  # + event id: one usage row


def header(desk: BudgetDesk) -> dict[str, Any]:
    return {
        "v": STATE_FORMAT,
        "l": desk.lateness_us,
        "x": None if desk.expected is None else sorted(desk.expected),
        "wm": desk.watermark_us,
        "d": desk.decided_us,
        "late": desk.late,
        "dropped": desk.dropped,
        "fired": [
            [desk.budgets[k[0]].scope_id, k[1], label, at, k in desk.resolved]
            for k, labels in desk.fired.items()
            for label, at in labels.items()
        ],
        "lanes": [
            [lane, r.mark_us, r.pending_us, r.idle, r.quiet, r.hold_us]
            for lane, r in desk.lanes.items()
        ],
    }


def dump(desk: BudgetDesk) -> bytes:
    rows = [[*r.to_list(), eff] for r, eff in desk.rows.values()]
    return orjson.dumps({**header(desk), "rows": rows})


def writes(desk: BudgetDesk) -> dict[bytes, bytes | None]:
    out: dict[bytes, bytes | None] = {}
    for eid in sorted(desk._dirty):
        kept = desk.rows.get(eid)
        key = ROW_PREFIX + eid.encode()
        out[key] = None if kept is None else orjson.dumps([*kept[0].to_list(), kept[1]])
    desk._dirty.clear()
    out[STATE_KEY] = orjson.dumps(header(desk))
    return out


def load(cls: type[BudgetDesk], raw: bytes, budgets: Budgets) -> BudgetDesk:
    d = orjson.loads(raw)
    return _restore(cls, d, d.get("rows", []) if isinstance(d, dict) else [], budgets)


def load_records(
    cls: type[BudgetDesk], records: Mapping[bytes, bytes], budgets: Budgets
) -> BudgetDesk:
    raw = records.get(STATE_KEY)
    if raw is None:
        raise BudgetStateError(
            f"the budget desk's state has no header record {STATE_KEY.decode()!r} "
            f"({len(records)} record(s) given); delete the desk's state to start over"
        )
    rows = (orjson.loads(v) for k, v in records.items() if k.startswith(ROW_PREFIX))
    return _restore(cls, orjson.loads(raw), rows, budgets)


def _restore(
    cls: type[BudgetDesk], d: Any, rows: Iterable[list[Any]], budgets: Budgets
) -> BudgetDesk:
    from ._desk import _EXACT, _NEVER

    if not isinstance(d, dict) or d.get("v") != STATE_FORMAT:
        version = d.get("v") if isinstance(d, dict) else None
        raise BudgetStateError(
            f"budget desk state of format {version!r} cannot be read (this version reads "
            f"{STATE_FORMAT}); delete the desk's state to start over"
        )
    desk = cls(budgets, d["l"] / 1_000_000, d["x"])
    desk.watermark_us, desk.decided_us = d["wm"], d["d"]
    desk.late, desk.dropped = d["late"], d["dropped"]
    for lane, mark, pending, idle, quiet, *hold in d["lanes"]:  # no hold: written before
        desk.lanes[lane] = LaneReport(mark, pending, idle, quiet, hold[0] if hold else None)
    index = {b.scope_id: i for i, b in enumerate(desk.budgets)}
    for scope_id, start, label, at, resolved in d["fired"]:
        if scope_id in index:
            desk.fired.setdefault((index[scope_id], start), {})[label] = at
            if resolved:
                desk.resolved.add((index[scope_id], start))
    if desk.decided_us != _NEVER:
        desk._kept = desk._keep()
        desk._horizon_us = desk._horizon(desk._kept)
    with localcontext(_EXACT):
        for v in rows:
            row = SpendRow.from_list(v[:-1])
            desk.rows[row.event_id] = (row, v[-1])
            desk._add(row, v[-1])
    return desk
