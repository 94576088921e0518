"""Keep the cyclic garbage collector off the worker's hot path.

Every run the worker holds (facts, timelines, dedup keys) is made of many small
containers, and each batch adds more. Left to its thresholds, the collector keeps
re-walking that long-lived state: it cost about a third of the core's time per event
(``bench``'s stage table). Nearly all of it is acyclic and freed by reference counting
when a run closes, so automatic collection is off while a batch is handled (``batch``)
and the survivors are then frozen (moved out of the collector's sight, ``gc.freeze``):
between batches the collector only looks at what was allocated since. Cyclic garbage
among frozen objects would stay until the next full pass, so ``maybe_collect`` unfreezes
and collects everything once per ``full_every`` seconds, called from the timer (between
batches): memory stays bounded.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["GcPolicy"]


class GcPolicy:
    """``batch`` keeps the collector out of a batch and freezes its survivors;
    ``maybe_collect`` runs the periodic full pass."""

    def __init__(
        self, full_every: float = 60.0, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.full_every = full_every
        self._clock = clock
        self._last_full = clock()
        self.full_passes = 0
        self.collected = 0
        self.last_pause = 0.0  # seconds the last full pass took

    @contextmanager
    def batch(self) -> Iterator[None]:
        """No automatic collection inside; what survives the batch is frozen after it."""
        enabled = gc.isenabled()
        gc.disable()
        try:
            yield
        finally:
            gc.freeze()
            if enabled:
                gc.enable()

    def maybe_collect(self) -> bool:
        """A full collection if ``full_every`` seconds passed since the last; True if run."""
        now = self._clock()
        if now - self._last_full < self.full_every:
            return False
        started = time.perf_counter()
        gc.unfreeze()
        self.collected += gc.collect()
        gc.freeze()
        self.last_pause = time.perf_counter() - started
        self._last_full = self._clock()
        self.full_passes += 1
        return True
