"""Keep the cyclic garbage collector off the worker's hot path.

Every run the worker holds (facts, timelines, dedup keys) is made of many small
containers, and each batch adds more. Left to its thresholds, the collector keeps
re-walking that long-lived state: it cost about a third of the core's time per event
(``bench``'s stage table). Nearly all of it is acyclic and freed by reference counting
when a run closes, so automatic collection is off while a batch or a timer tick is
handled (``batch``) and the survivors are then frozen (moved out of the collector's
sight, ``gc.freeze``): between them the collector only looks at what was allocated
since. Cyclic garbage among frozen objects would stay until the next full pass, so
``maybe_collect`` unfreezes and collects everything, called from the timer (between
batches): memory stays bounded.

A full pass holds the interpreter for as long as it walks every object: 3.5-11 s for
workers of 3-5 GB in a 10-minute soak at 5,000 events/s, every minute, and no heartbeat
leaves while it runs (the session timeout is 10 s). So the pass runs once per
``full_every`` seconds or once per ``1 / duty`` times its last pause, whichever is longer:
a pass of 5 s comes every 500 s at the default 1%, one of 0.1 s every minute.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["GcPolicy"]

log = logging.getLogger("prism.worker")


class GcPolicy:
    """``batch`` keeps the collector out of a batch and freezes its survivors;
    ``maybe_collect`` runs the periodic full pass."""

    def __init__(
        self,
        full_every: float = 60.0,
        *,
        duty: float | None = 0.01,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.full_every = full_every
        self.duty = duty  # the share of wall time full passes may take (None: any)
        self._clock = clock
        self._last_full = clock()
        self.full_passes = 0
        self.collected = 0
        self.last_pause = 0.0  # seconds the last full pass took
        self.longest_pause = 0.0
        self.last_objects = 0  # objects the last full pass looked at (frozen before it)

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
        """A full collection if ``interval`` seconds passed since the last; True if run."""
        now = self._clock()
        if now - self._last_full < self.interval:
            return False
        started = time.perf_counter()
        self.last_objects = gc.get_freeze_count()
        gc.unfreeze()
        found = gc.collect()
        gc.freeze()
        self.last_pause = time.perf_counter() - started
        self.longest_pause = max(self.longest_pause, self.last_pause)
        self.collected += found
        self._last_full = self._clock()
        self.full_passes += 1
        log.info(
            "gc: a full pass over %d objects found %d unreachable in %.2fs",
            self.last_objects, found, self.last_pause,
        )  # fmt: skip
        return True

    @property
    def interval(self) -> float:
        """Seconds from one full pass to the next: at least ``full_every``, and long enough
        that passes take no more than ``duty`` of the time."""
        if self.duty is None:
            return self.full_every
        return max(self.full_every, self.last_pause / self.duty)

    def figures(self) -> dict[str, object]:
        """The collector's figures for the worker's stats file."""
        return {
            "gc_full_passes": self.full_passes,
            "gc_collected": self.collected,
            "gc_last_objects": self.last_objects,
            "gc_pause_last_s": round(self.last_pause, 3),
            "gc_pause_max_s": round(self.longest_pause, 3),
        }
