"""``RunSequencer``: puts one run's events back in ``seq`` order and knows when the run ended.

Pure and synchronous, shared by the Kafka tail and the ledger replay. The rule is the
contract's: the run ends at the terminal event with the lowest ``seq`` and is complete once
every lower ``seq`` arrived. The same ``eventId`` or the same ``(runId, seq)`` is shown
once; events above the terminal are post-terminal and never released.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core import seq_gaps
from ._events import ReplayEvent

__all__ = ["RunSequencer", "TailResult", "format_seqs"]


@dataclass(slots=True)
class TailResult:
    """How a replay of one run ended: complete, or with the seqs that never arrived."""

    run_id: str
    complete: bool
    terminal_seq: int | None
    terminal_type: str | None
    missing: list[tuple[int, int]]  # inclusive seq ranges
    printed: int
    duplicates: int
    post_terminal: int
    other: dict[str, int] = field(default_factory=dict)  # e.g. {"invalid": 2}

    def describe(self) -> str:
        """One line for stderr: how the run ended, or what is missing."""
        if self.complete:
            return (
                f"run {self.run_id}: complete, {self.printed} events, terminal "
                f"{self.terminal_type} at seq {self.terminal_seq}"
                f"{self._noise()}"
            )
        ending = (
            "no terminal event yet"
            if self.terminal_seq is None
            else f"terminal {self.terminal_type} at seq {self.terminal_seq}"
        )
        gaps = format_seqs(self.missing) if self.missing else "none"
        return (
            f"run {self.run_id}: incomplete, {ending}; missing seqs: {gaps}; "
            f"{self.printed} events printed{self._noise()}"
        )

    def _noise(self) -> str:
        extra = [f"{self.duplicates} duplicates"] if self.duplicates else []
        if self.post_terminal:
            extra.append(f"{self.post_terminal} post-terminal")
        extra += [f"{v} {k}" for k, v in sorted(self.other.items()) if v]
        return f" ({', '.join(extra)} skipped)" if extra else ""


class RunSequencer:
    """Buffers out-of-order events of one run and releases the contiguous prefix.

    Example::

        seq = RunSequencer("run-1")
        for ev in events:                  # any order, duplicates allowed
            for ready in seq.push(ev):     # contiguous from seq 0, each once
                print(ready.seq)
        seq.complete                       # terminal reached, nothing below it missing
    """

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.next_seq = 0  # the lowest seq not yet released
        self.terminal: ReplayEvent | None = None
        self.duplicates = 0
        self.post_terminal = 0
        self.released = 0
        self._buffer: dict[int, ReplayEvent] = {}
        self._event_ids: set[str] = set()
        self._seqs: set[int] = set()  # accepted seqs (at or below the terminal)
        self._max_seq = -1

    @property
    def terminal_seq(self) -> int | None:
        return None if self.terminal is None else self.terminal.seq

    @property
    def complete(self) -> bool:
        """The terminal and every lower seq were released."""
        return self.terminal is not None and self.next_seq > self.terminal.seq

    def push(self, ev: ReplayEvent) -> list[ReplayEvent]:
        """Accept one event; return the events now releasable, in seq order."""
        if ev.run_id != self.run_id or self.complete:
            if ev.run_id == self.run_id:
                self._count_late(ev)
            return []
        if ev.event_id in self._event_ids or ev.seq in self._seqs:
            self.duplicates += 1
            return []
        self._event_ids.add(ev.event_id)
        term = self.terminal
        if term is not None and ev.seq > term.seq:
            self.post_terminal += 1
            return []
        if ev.is_terminal:  # a lower terminal wins; what waited above it is post-terminal
            above = [s for s in self._buffer if s > ev.seq]
            for s in above:
                del self._buffer[s]
                self._seqs.discard(s)
            self.post_terminal += len(above)
            self.terminal = ev
        self._seqs.add(ev.seq)
        self._max_seq = max(self._max_seq, ev.seq)
        self._buffer[ev.seq] = ev
        return self._release()

    def _count_late(self, ev: ReplayEvent) -> None:
        assert self.terminal is not None
        if ev.event_id in self._event_ids or ev.seq in self._seqs:
            self.duplicates += 1
        else:
            self.post_terminal += 1

    def _release(self) -> list[ReplayEvent]:
        out = []
        while not self.complete and self.next_seq in self._buffer:
            out.append(self._buffer.pop(self.next_seq))
            self.next_seq += 1
        self.released += len(out)
        return out

    def missing(self) -> list[tuple[int, int]]:
        """Seq ranges below the terminal (or the highest seen) that never arrived."""
        upper = self.terminal.seq if self.terminal is not None else self._max_seq
        return seq_gaps(self._seqs, upper)[0] if upper >= 0 else []

    def drain(self) -> list[ReplayEvent]:
        """Give up waiting: release what is buffered, in seq order, skipping the gaps."""
        out = [self._buffer[s] for s in sorted(self._buffer)]
        self._buffer.clear()
        self.released += len(out)
        return out

    def result(self, **other: int) -> TailResult:
        term = self.terminal
        return TailResult(
            run_id=self.run_id,
            complete=self.complete,
            terminal_seq=None if term is None else term.seq,
            terminal_type=None if term is None else term.type,
            missing=[] if self.complete else self.missing(),
            printed=self.released,
            duplicates=self.duplicates,
            post_terminal=self.post_terminal,
            other=dict(other),
        )


def format_seqs(ranges: list[tuple[int, int]]) -> str:
    """``[(1, 3), (7, 7)]`` -> ``"1-3, 7"``."""
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)
