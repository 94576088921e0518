"""Envelope building for one simulated run: seq, time-ordered ids, timestamps, ownership."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

__all__ = ["SCHEMA_ID", "Event", "RunBuilder", "format_ts", "hex_id", "uuid7"]

SCHEMA_ID = "prism.agent-event/v1"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# One generated event: (ts in epoch milliseconds, the wire envelope as a dict).
Event = tuple[int, dict[str, Any]]


_SECONDS: dict[int, str] = {}


def format_ts(ms: int) -> str:
    """RFC 3339 with an explicit offset and millisecond precision."""
    sec, frac = divmod(ms, 1000)
    head = _SECONDS.get(sec)
    if head is None:
        if len(_SECONDS) > 100_000:
            _SECONDS.clear()
        head = _SECONDS[sec] = (_EPOCH + timedelta(seconds=sec)).isoformat()[:19]
    return f"{head}.{frac:03d}+00:00"


def uuid7(ms: int, rnd: int) -> str:
    """A UUIDv7 string (time-ordered) from a millisecond timestamp and 74 random bits."""
    n = (ms & 0xFFFFFFFFFFFF) << 80 | 0x7 << 76 | (rnd >> 62 & 0xFFF) << 64 | 0b10 << 62
    n |= rnd & ((1 << 62) - 1)
    h = f"{n:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def hex_id(rng: random.Random, nbytes: int = 8) -> str:
    """``nbytes`` random bytes as lowercase hex (deterministic for the generator's seed)."""
    return f"{rng.getrandbits(nbytes * 8):0{nbytes * 2}x}"


class RunBuilder:
    """Emits one run's envelopes with consecutive ``seq`` and a moving event-time cursor."""

    __slots__ = ("_common", "events", "now", "rng", "run_id", "seq", "terminal_index")

    def __init__(
        self, rng: random.Random, run_id: str, start_ms: int, common: dict[str, Any]
    ) -> None:
        self.rng = rng
        self.run_id = run_id
        self.now = start_ms
        self.seq = 0
        self._common = common
        self.events: list[Event] = []
        self.terminal_index: int | None = None

    def advance(self, lo_ms: int, hi_ms: int) -> None:
        """Move the event-time cursor forward by a random amount in [lo_ms, hi_ms]."""
        self.now += self.rng.randint(lo_ms, hi_ms)

    def emit(self, type_: str, data: dict[str, Any], *, terminal: bool = False) -> dict[str, Any]:
        """Append one envelope at the cursor time and return it."""
        ms = self.now
        ev = {
            "schema": SCHEMA_ID,
            "eventId": uuid7(ms, self.rng.getrandbits(74)),
            "runId": self.run_id,
            "seq": self.seq,
            "type": type_,
            "ts": format_ts(ms),
            **self._common,
            "data": data,
        }
        if terminal and self.terminal_index is None:
            self.terminal_index = len(self.events)
        self.events.append((ms, ev))
        self.seq += 1
        return ev

    @property
    def terminal_seq(self) -> int | None:
        """The seq of the run's (first) terminal event, or None while it has none."""
        if self.terminal_index is None:
            return None
        return int(self.events[self.terminal_index][1]["seq"])
