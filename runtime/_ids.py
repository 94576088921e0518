"""Event ids (UUIDv7, unique and time-ordered) and RFC 3339 UTC timestamps.

``new_event_id()`` follows RFC 9562 section 6.2 method 1: 48 bits of Unix milliseconds,
then a 42-bit counter (the 12 ``rand_a`` bits and the top 30 ``rand_b`` bits) seeded
randomly each millisecond and incremented within it, then 32 random bits. Ids made by one
process are therefore strictly increasing, also as strings, even within one millisecond
or when the wall clock steps back; ids of different processes still differ by their
random bits.

Example::

    new_event_id()   # '019ad5a1-7c3e-7a41-8f0e-2b6c1d9e4f70'
    utc_now_rfc3339()  # '2026-11-30T12:00:00.123456+00:00'
"""

from __future__ import annotations

import os
import threading
import time
from datetime import UTC, datetime

__all__ = ["new_event_id", "utc_now_rfc3339"]

_COUNTER_BITS = 42
_COUNTER_MAX = (1 << _COUNTER_BITS) - 1
_SEED_MASK = (1 << (_COUNTER_BITS - 1)) - 1  # top counter bit starts at 0: room to count


class _UUIDv7Generator:
    """Monotonic UUIDv7 source (one per process; thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_ms = 0
        self._counter = 0

    def next(self) -> str:
        with self._lock:
            now_ms = time.time_ns() // 1_000_000
            if now_ms > self._last_ms:
                self._last_ms = now_ms
                self._counter = int.from_bytes(os.urandom(6)) & _SEED_MASK
            else:  # same millisecond, or the clock went back: keep counting upwards
                self._counter += 1
                if self._counter > _COUNTER_MAX:
                    self._last_ms += 1
                    self._counter = int.from_bytes(os.urandom(6)) & _SEED_MASK
            ms, counter = self._last_ms, self._counter
        tail = int.from_bytes(os.urandom(4))
        value = (
            (ms & 0xFFFF_FFFF_FFFF) << 80
            | 0x7 << 76  # version 7
            | (counter >> 30) << 64  # rand_a: top 12 counter bits
            | 0b10 << 62  # variant
            | (counter & 0x3FFF_FFFF) << 32  # top 30 bits of rand_b
            | tail
        )
        h = f"{value:032x}"
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


_generator = _UUIDv7Generator()


def new_event_id() -> str:
    """A new UUIDv7 string: unique, and greater than every id this process made before."""
    return _generator.next()


def utc_now_rfc3339() -> str:
    """The current time as RFC 3339 in UTC with microseconds and an explicit ``+00:00``."""
    return datetime.now(UTC).isoformat(timespec="microseconds")
