"""Notice when the worker's event loop stops turning, and say where it stands.

The consumer's heartbeats, the transactions and the group's callbacks all run on the one
event loop; if something holds it (a synchronous call, a long collector pass) for longer
than the session timeout, the broker drops the worker from the group and every partition
moves. ``LoopWatch`` makes that visible: a task on the loop stamps the time every
``tick_s``, and a daemon thread that finds the stamp older than ``warn_s`` logs once per
episode the loop thread's stack at that moment, then, when the loop turns again, how long
it was held. ``longest_s`` and ``episodes`` go to the worker's stats.

``Laps`` does the same for the batch lock: where a batch or tick that held it too long
spent the time (the worker's slow-batch line).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable

__all__ = ["Laps", "LoopWatch"]

log = logging.getLogger("prism.worker")


class LoopWatch:
    """``start`` on the loop to watch; ``stop`` when leaving it."""

    def __init__(
        self,
        warn_s: float = 2.0,
        *,
        tick_s: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if warn_s <= tick_s:
            raise ValueError(f"warn_s ({warn_s}) must be above tick_s ({tick_s})")
        self.warn_s, self.tick_s = warn_s, tick_s
        self._clock = clock
        self._stamp = clock()
        self._loop_thread: int | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self.longest_s = 0.0
        self.episodes = 0
        self._held_since: float | None = None  # the stamp of the episode being logged

    def start(self) -> None:
        """Watch the running loop (call from a coroutine on it)."""
        self._loop_thread = threading.get_ident()
        self._stamp = self._clock()
        self._task = asyncio.get_running_loop().create_task(self._beat())
        self._thread = threading.Thread(target=self._watch, name="loop-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._task is not None:
            self._task.cancel()

    def beat(self) -> None:
        """The loop turned (its task's, or a test's)."""
        self._stamp = self._clock()

    async def _beat(self) -> None:
        while True:
            self.beat()
            await asyncio.sleep(self.tick_s)

    def _watch(self) -> None:
        while not self._stopped.wait(self.tick_s):
            self.check()

    def check(self) -> float:
        """One look (the thread's, or a test's): the seconds the loop has been held."""
        stamp = self._stamp
        held = self._clock() - stamp
        if self._held_since is not None and stamp != self._held_since:
            self._ended(self._held_since, stamp)
        if held >= self.warn_s and self._held_since is None:
            self._held_since = stamp
            self.episodes += 1
            log.warning(
                "the event loop has not turned for %.1fs (heartbeats wait on it); it is at:\n%s",
                held,
                self._stack(),
            )
        return held

    def _ended(self, since: float, turned: float) -> None:
        seconds = turned - since
        self.longest_s = max(self.longest_s, seconds)
        self._held_since = None
        log.warning("the event loop turned again after %.1fs", seconds)

    def _stack(self) -> str:
        frame = sys._current_frames().get(self._loop_thread or -1)
        if frame is None:
            return "  (the loop's thread is gone)"
        return "".join(traceback.format_stack(frame)[-12:])


class Laps:
    """Where a stretch of work spent its time: ``lap(name)`` ends the part since the last
    lap (or the start) and adds it to ``name``'s; ``str`` names the parts of 0.1 s or more,
    longest first, then the ``note``s (what a slow batch or tick waited on and did, for its
    log line)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last = clock()
        self.parts: dict[str, float] = {}
        self.notes: list[str] = []  # what the parts did, in a few words each

    def lap(self, name: str) -> None:
        now = self._clock()
        self.parts[name] = self.parts.get(name, 0.0) + now - self._last
        self._last = now

    def note(self, text: str) -> None:
        self.notes.append(text)

    def __str__(self) -> str:
        parts = sorted(self.parts.items(), key=lambda kv: -kv[1])
        said = ", ".join(f"{name} {s:.1f}s" for name, s in parts if s >= 0.1)
        return "; ".join([said or "no part over 0.1s", *self.notes])
