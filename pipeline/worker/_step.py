"""Step 1 of the checkpoint (``_checkpoint``), as the worker's step thread runs it.

``StepThread.step`` steps a batch's lanes through the shared intake
(``core.store_isolating``: parse, run semantics, poison isolation) and has the ledger
acknowledge their rows before anything is written to Kafka. A step that would leave a lane
state larger than one changelog record holds is refused before its insert
(``check_state_size``), so ``store_isolating`` dead-letters the record that makes it so
(``unstorable``) and the partition moves on (rule 15). Both parts are timed for the
worker's stats file (``step_thread``, ``store``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ..core import InRecord, Intake, Output, PermanentStoreError, StateKey, store_isolating
from ._telemetry import WorkerTelemetry

__all__ = ["StepThread", "check_state_size"]


def check_state_size(out: Output, limit: int) -> None:
    """Refuse (``PermanentStoreError``) a step whose state would not fit in one state record."""
    for key, value in out.state_writes.items():
        if value is not None and len(value) > limit:
            parsed = StateKey.of(key)
            name = key if parsed is None or parsed.name is None else parsed.name
            raise PermanentStoreError(
                f"the state of {name!r} would be {len(value):,} bytes, more than the "
                f"{limit:,} a changelog record holds (PRISM_MAX_EVENT_BYTES sets it)"
            )


@contextmanager
def _timed(telemetry: WorkerTelemetry, stage: str) -> Iterator[None]:
    """Add the block's wall time to ``stage`` and its CPU time in this thread to
    ``<stage>_cpu``: what the two differ by was waiting, not work."""
    started, cpu = time.perf_counter(), time.thread_time()
    try:
        yield
    finally:
        telemetry.stage(stage, time.perf_counter() - started)
        telemetry.stage(f"{stage}_cpu", time.thread_time() - cpu)


class StepThread:
    """The intake step and the ledger's acknowledgement of a batch; ``store`` writes a
    step's rows, ``max_state_bytes`` bounds a lane's state, ``clock`` is processing time."""

    def __init__(
        self,
        intake: Intake,
        store: Callable[[Output], None],
        telemetry: WorkerTelemetry,
        max_state_bytes: int,
        clock: Callable[[], float],
    ) -> None:
        self.intake = intake
        self.store = store
        self.telemetry = telemetry
        self.max_state_bytes = max_state_bytes
        self.clock = clock

    def step(
        self, batches: dict[int, list[InRecord]], parts: dict[int, Output], forwarded: bool
    ) -> Output:
        """Step ``batches`` (lane -> records; ``forwarded``: repartition-topic copies) and
        store their rows; each lane's output is added to ``parts`` for its slot's
        transaction, even when a later lane fails."""
        mine: dict[int, Output] = {}
        with _timed(self.telemetry, "step_thread"):
            try:
                return store_isolating(
                    self.intake, batches, self.clock(), self._store_bounded, mine,
                    forwarded=forwarded,
                )  # fmt: skip
            finally:
                for lane, part in mine.items():
                    parts.setdefault(lane, Output()).extend(part)

    def _store_bounded(self, out: Output) -> None:
        check_state_size(out, self.max_state_bytes)
        with _timed(self.telemetry, "store"):
            self.store(out)
