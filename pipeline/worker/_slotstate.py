"""The typed, versioned record of a slot's position, committed with each of its batches.

A slot's runs and channel operations are keyed state records of the core (``Output.state_writes``);
beside them, in the same state topic partition and the same transaction, the slot's owner
writes one ``SlotState`` under ``KEY``: the next offset of each of its partitions and the
input topic's partition count. The next owner reads it back with the rest of the slot's
state and seeks each partition there; a worker whose input topic has another partition
count than the state was written with refuses the slot (adding partitions moves most
runs' home partition: SCALING.md, "Changing the partition count").

It also keeps the slot's *generation*: each owner that restores the slot takes one above
the stored one and above every earlier restore's (``next_generation``: tenths of a second
since 2026, or the stored one plus one), and its ledger rows carry it in their versions
(``core.KeyedProcessor.row_version``). Rows an earlier owner inserted but never committed
(a crash or a fence between the insert and the transaction) are thereby outranked by the
new owner's rows of the same keys, whatever batch cut either of them stepped.

And it keeps the *copies in flight* of the process that wrote it: for each home lane it
forwarded records to (agent events, or channel operations on the ``CHANNEL_LANE``
numbers), the earliest event time of the copies it has not yet seen applied there and
the offset of the last one (``_slots.Slots.in_flight``). They hold
the watermark until their home's repartition position passes that offset. A process
that dies takes its memory with it; the next owner of any of its slots reads them here
and holds the watermark for them in its place, so no run is closed, shrunk or alerted on
past a copy still on its way (rule 16), and no channel operation flagged ``stuck`` past
one, because the process that sent it is gone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson

__all__ = ["FORMAT", "KEY", "SlotState", "next_generation"]

FORMAT = 1
KEY = b"slot-position"  # no \x1f: never taken for a lane's key
_GENERATION_EPOCH = 1_767_225_600  # 2026-01-01T00:00:00Z; tenths of a second since fit 38 bits


def next_generation(stored: int, now: float) -> int:
    """The generation of an owner restoring a slot whose state says ``stored``, at ``now``
    (Unix seconds): above the stored one, and above any earlier restore's, which happened
    at an earlier time (an owner loses a slot only through a rebalance, which takes far
    longer than a tenth of a second)."""
    return max(stored + 1, int((now - _GENERATION_EPOCH) * 10))


@dataclass(frozen=True, slots=True)
class SlotState:
    """Where a slot's partitions stand: topic -> next offset; the input's partition count."""

    partitions: int
    positions: dict[str, int] = field(default_factory=dict)
    generation: int = 0  # the owner generation its rows carry (absent before: 0)
    # home lane -> (earliest event time, offset of the last copy) of copies in flight
    copies: dict[int, tuple[int, int]] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        d: dict[str, object] = {
            "format": FORMAT,
            "partitions": self.partitions,
            "positions": self.positions,
            "generation": self.generation,
        }
        if self.copies:
            d["copies"] = {str(lane): list(v) for lane, v in sorted(self.copies.items())}
        return orjson.dumps(d)

    @classmethod
    def from_bytes(cls, raw: bytes) -> SlotState:
        """Parse a stored record; ``ValueError`` names what is wrong with it."""
        try:
            d = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"slot position record is not JSON: {exc}") from exc
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            got = d.get("format") if isinstance(d, dict) else type(d).__name__
            raise ValueError(f"slot position record of format {got!r}; this worker reads {FORMAT}")
        positions = d.get("positions")
        partitions = d.get("partitions")
        if not isinstance(partitions, int) or not isinstance(positions, dict):
            raise ValueError(f"slot position record without partitions/positions: {d!r}")
        if not all(isinstance(k, str) and isinstance(v, int) for k, v in positions.items()):
            raise ValueError(f"slot position record with bad positions: {positions!r}")
        generation = d.get("generation", 0)
        if not isinstance(generation, int) or isinstance(generation, bool) or generation < 0:
            raise ValueError(f"slot position record with a bad generation: {generation!r}")
        return cls(partitions, dict(positions), generation, _copies(d.get("copies", {})))


def _copies(raw: object) -> dict[int, tuple[int, int]]:
    """The ``copies`` of a stored record (absent before: none); ``ValueError`` names a bad one."""
    out: dict[int, tuple[int, int]] = {}
    if not isinstance(raw, dict):
        raise ValueError(f"slot position record with bad copies in flight: {raw!r}")
    for lane, v in raw.items():
        ok = isinstance(v, list) and len(v) == 2 and all(type(x) is int for x in v)
        if not ok or not isinstance(lane, str) or not lane.isdigit():
            raise ValueError(f"slot position record with bad copies in flight: {lane!r}: {v!r}")
        out[int(lane)] = (v[0], v[1])
    return out
