"""The typed, versioned record of a slot's position, committed with each of its batches.

A slot's runs and channel operations are keyed state records of the core (``Output.state_writes``);
beside them, in the same state topic partition and the same transaction, the slot's owner
writes one ``SlotState`` under ``KEY``: the next offset of each of its partitions and the
input topic's partition count. The next owner reads it back with the rest of the slot's
state and seeks each partition there; a worker whose input topic has another partition
count than the state was written with refuses the slot (adding partitions moves most
runs' home partition: SCALING.md, "Changing the partition count").
"""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson

__all__ = ["FORMAT", "KEY", "SlotState"]

FORMAT = 1
KEY = b"slot-position"  # no \x1f: never taken for a lane's key


@dataclass(frozen=True, slots=True)
class SlotState:
    """Where a slot's partitions stand: topic -> next offset; the input's partition count."""

    partitions: int
    positions: dict[str, int] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        return orjson.dumps(
            {"format": FORMAT, "partitions": self.partitions, "positions": self.positions}
        )

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
        return cls(partitions, dict(positions))
