"""Per-minute prompt-cache totals per (tenant, provider, model) for one source partition.

Each bucket holds full running totals, never deltas: its row replaces the previous one
(``version`` = turns counted), so a batch written twice changes nothing. Hit rates are
derived from token sums downstream, never averaged.
"""

from __future__ import annotations

from typing import Any

import orjson

from prism.schemas import CacheMinuteRow

from ._run import from_us
from ._timeline import _turn_cache_inputs

__all__ = ["CacheMinutes"]

_MINUTE_US = 60_000_000
# turns, reporting, not_reporting, input, input_reporting, read, write
_FIELDS = 7
_SEP = "\x1f"


class CacheMinutes:
    """Running cache counters by minute bucket; rows for buckets touched since the last flush."""

    def __init__(self, partition: int) -> None:
        self.partition = partition
        self.buckets: dict[tuple[int, str, str, str], list[int]] = {}
        self._dirty: set[tuple[int, str, str, str]] = set()

    def add_turn(
        self, ts_us: int, tenant: str, provider: str, model: str, d: dict[str, Any]
    ) -> None:
        key = (ts_us - ts_us % _MINUTE_US, tenant, provider, model)
        c = self.buckets.get(key)
        if c is None:
            c = self.buckets[key] = [0] * _FIELDS
        read, write, inp = _turn_cache_inputs(d)
        c[0] += 1
        if read is not None:
            c[1] += 1
            c[5] += read
            if inp is not None:
                c[4] += inp
        else:
            c[2] += 1
        if inp is not None:
            c[3] += inp
        if write is not None:
            c[6] += write
        self._dirty.add(key)

    def take_rows(self) -> list[CacheMinuteRow]:
        rows = [
            CacheMinuteRow(
                minute=from_us(k[0]),
                tenant_id=k[1],
                provider=k[2],
                model=k[3],
                partition=self.partition,
                turns=c[0],
                turns_reporting_cache=c[1],
                turns_not_reporting_cache=c[2],
                input_tokens=c[3],
                input_tokens_reporting_cache=c[4],
                cache_read_tokens=c[5],
                cache_write_tokens=c[6],
                version=c[0],
            )
            for k in sorted(self._dirty)
            for c in (self.buckets[k],)
        ]
        return rows

    def take_state_writes(self) -> dict[str, bytes | None]:
        writes: dict[str, bytes | None] = {
            self.state_key(k): orjson.dumps(self.buckets[k]) for k in self._dirty
        }
        self._dirty.clear()
        return writes

    def expire(self, before_us: int) -> dict[str, bytes | None]:
        """Forget buckets older than ``before_us``; a late turn there would restart its count."""
        old = [k for k in self.buckets if k[0] < before_us]
        for k in old:
            del self.buckets[k]
            self._dirty.discard(k)
        return dict.fromkeys((self.state_key(k) for k in old), None)

    def state_key(self, k: tuple[int, str, str, str]) -> str:
        return _SEP.join(("c", str(self.partition), str(k[0]), k[1], k[2], k[3]))

    def load(self, key: str, value: bytes) -> None:
        _, _p, minute, tenant, provider, model = key.split(_SEP)
        self.buckets[(int(minute), tenant, provider, model)] = orjson.loads(value)
