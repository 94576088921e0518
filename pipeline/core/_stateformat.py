"""The stored form of lane state: one parse of a state key, a format version in every row.

A lane's state is a set of rows in the worker's state topic (and in ``ingest_state`` for
file replays), keyed ``<kind>\\x1f<lane>[\\x1f<name>]``:

- ``r\\x1f<lane>\\x1f<run id>``: a run (``RunState``);
- ``c\\x1f<lane>\\x1f<operation key>``: a channel operation (``OperationState``);
- ``m\\x1f<lane>`` / ``cm\\x1f<lane>``: a processor's meta record (mark, next offsets);
- anything else is another component's (the slot's position record, the alerter's).

``StateKey.parse`` is the one place such a key is taken apart. Every row a processor
writes carries ``"v": STATE_FORMAT``; a row without it is of the format before (read as
it always was), and a row of a newer format than this code knows is refused with the key
and both versions named (``StateFormatError``): a worker of an older release must not
read state a newer one wrote and write it back without the fields it does not know.

Formats: 0, rows without ``v``; 1, ``v`` added; 2, a run's facts, emitted rows and turns
moved under one last key ``b`` (``RunState.head`` reads a run without them, so a lane's
restore decodes only the runs still open or closing, see ``Processor._load_item``); 3, a
run's distinct envelopes stored once at the end of ``b`` and named by index in its facts
(they were about 40% of a run's bytes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["STATE_FORMAT", "StateFormatError", "StateKey", "check_format"]

STATE_FORMAT = 3  # the format of the rows this code writes
_SEP = "\x1f"


class StateFormatError(ValueError):
    """A state row this code cannot read (a malformed key, a newer format)."""


@dataclass(frozen=True, slots=True)
class StateKey:
    """A parsed state key: its kind (prefix), its lane, and the item's name (None: meta)."""

    kind: str
    lane: int
    name: str | None = None

    @classmethod
    def parse(cls, raw: str | bytes) -> StateKey:
        """Take a key apart; ``StateFormatError`` naming the key when it is not one."""
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        kind, sep, rest = text.partition(_SEP)
        lane_text, sep2, name = rest.partition(_SEP)
        if not kind or not sep:
            raise StateFormatError(f"state key {text!r} has no kind and lane")
        try:
            lane = int(lane_text)
        except ValueError:
            raise StateFormatError(f"state key {text!r}: lane {lane_text!r} is no number") from None
        return cls(kind, lane, name if sep2 else None)

    @classmethod
    def of(cls, raw: str | bytes) -> StateKey | None:
        """``parse``, or None for a key that is not a lane's (another component's row)."""
        try:
            return cls.parse(raw)
        except StateFormatError:
            return None

    def __str__(self) -> str:
        head = f"{self.kind}{_SEP}{self.lane}"
        return head if self.name is None else f"{head}{_SEP}{self.name}"


def check_format(row: dict[str, Any], what: str) -> dict[str, Any]:
    """``row`` if this code reads its format (``v``; absent: the format before), else
    ``StateFormatError`` naming ``what`` (the row's key or item) and both versions."""
    version = row.get("v", 0)
    if not isinstance(version, int) or isinstance(version, bool) or version > STATE_FORMAT:
        raise StateFormatError(
            f"state row {what!r} is of format {version!r}; this release reads formats up "
            f"to {STATE_FORMAT}: run the release that wrote it, or a newer one"
        )
    return row
