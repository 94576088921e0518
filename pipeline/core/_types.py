"""Plain data passed in and out of the core: configuration, deliveries, outputs, the clock."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Generic, TypeVar

from prism.schemas import DEFAULT_DENY, LedgerBatch

__all__ = [
    "CoreConfig",
    "Delivery",
    "EventClock",
    "Forward",
    "LaneReport",
    "LimitDeath",
    "OutRecord",
    "Output",
    "forwarded_lane",
]

_US = 1_000_000
E = TypeVar("E")
_FORWARDED_LANES = -(1 << 40)


def forwarded_lane(lane: int) -> int:
    """The ``EventClock`` key of a lane's forwarded copies (its repartition partition).

    They keep a mark of their own: copies come from every other partition, at their pace,
    so their event times say nothing about where the lane's input partition is, and the
    reverse; a lane with records waiting on one of them holds the watermark at that one's
    mark. (Negative, below any lane and the file's -1.)
    """
    return _FORWARDED_LANES - lane


def lane_of_forwarded(key: int) -> int | None:
    """The lane whose forwarded copies ``key`` names (``forwarded_lane``'s inverse); None
    for a key that names no copies."""
    return _FORWARDED_LANES - key if key <= _FORWARDED_LANES else None


@dataclass(frozen=True, slots=True)
class CoreConfig:
    """Run-semantics knobs (schemas/CONTRACT.md rules 2, 4, 10 and 14).

    ``processing_grace``: whether a terminal's grace period may also end in processing time
    (the live worker, where a quiet topic must still close runs); a file replay judges on
    event time only, so the same file always gives the same ledger. ``redact_keys``: keys
    dropped from the ``data`` of event types the contract does not know before it is kept
    (``PRISM_REDACT_KEYS``), so content sent by mistake never reaches the ledger.
    ``channel_stuck_s``: a channel operation ``executing`` longer than this (event time)
    is flagged ``stuck`` (``PRISM_CHANNEL_STUCK_SECONDS``).
    """

    grace_period_s: float = 30.0
    stale_after_s: float = 3600.0
    tombstone_retention_s: float = 86400.0
    alert_window_s: float = 300.0
    alert_threshold: int = 5
    max_clock_skew_s: float = 300.0
    processing_grace: bool = True
    redact_keys: frozenset[str] = DEFAULT_DENY
    channel_stuck_s: float = 300.0
    allowed_lateness_s: float | None = None

    @property
    def lateness_s(self) -> float:
        """The allowed lateness of rule 16 (default: the grace period)."""
        return self.grace_period_s if self.allowed_lateness_s is None else self.allowed_lateness_s

    def __post_init__(self) -> None:
        for name in (
            "grace_period_s",
            "stale_after_s",
            "tombstone_retention_s",
            "alert_window_s",
            "max_clock_skew_s",
            "channel_stuck_s",
            "lateness_s",
        ):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0 or value > 10 * 365 * 86400:
                raise ValueError(
                    f"CoreConfig.{name} must be a finite number of seconds in "
                    f"0..315360000, got {value!r}"
                )
        if self.alert_threshold < 1:
            raise ValueError(f"CoreConfig.alert_threshold must be >= 1, got {self.alert_threshold}")


class EventClock:
    """The pipeline-wide event-time watermark (rule 10), skew-proof (rule 14).

    Every partition's processor of one pipeline shares one clock and keeps its own mark
    (the latest event time it saw). The watermark is the highest mark, held back by the
    marks of partitions the shell reports as still behind (records waiting on the topic;
    one that has no mark yet holds it at 0): a quiet, caught-up partition cannot keep a
    stale run ``running``, and a partition catching up after a restart or a replay does
    not see its own runs judged by the others' time. An event stamped more than
    ``max_skew_s`` ahead of the processing clock moves no mark at all: a bad producer
    clock can neither close nor expire other runs, not even in a backfill of old events,
    where "now plus the skew" would still be far ahead of everyone else.

    A lane that reads forwarded copies keeps their mark apart (``forwarded_lane``), and a
    copy on its way to a lane holds the watermark at its event time (``hold``): copies
    come at the pace of the partitions that forwarded them, so neither the lane's input
    nor the copies already applied say where the next copy is in event time.
    """

    __slots__ = (
        "_behind",
        "_holds",
        "_marks",
        "_remote",
        "_remote_held",
        "_remote_top",
        "max_skew_us",
    )

    def __init__(self, max_skew_s: float = 300.0) -> None:
        self.max_skew_us = int(max_skew_s * _US)
        self._marks: dict[int, int] = {}
        self._behind: set[int] = set()
        self._holds: dict[int, int] = {}  # key -> an event time still on its way there
        # lanes other processes hold: lane -> (mark, idle, hold), and what they add up to
        self._remote: dict[int, tuple[int, bool, int | None]] = {}
        self._remote_top = 0
        self._remote_held: int | None = None

    @property
    def top_us(self) -> int:
        """The highest mark of any lane: the watermark once nothing holds it back."""
        return max(max(self._marks.values(), default=0), self._remote_top)

    def figures(self) -> dict[str, int]:
        """The watermark and the top mark, for observers (a worker's stats file): equal
        once nothing holds the watermark back."""
        return {"watermark_us": self.watermark_us, "top_us": self.top_us}

    @property
    def watermark_us(self) -> int:
        if not self._marks and not self._remote:
            return 0
        top = self.top_us
        # a lane with records waiting and no mark yet (its first copies on their way)
        # holds at 0, as a remote lane reading without a mark does: nothing is decided
        # past records whose time nobody has seen
        held = [self._marks.get(p, 0) for p in self._behind]
        held += self._holds.values()
        if self._remote_held is not None:
            held.append(self._remote_held)
        return min(top, *held) if held else top

    def remote(self, lane: int, mark_us: int, idle: bool, hold_us: int | None = None) -> None:
        """A lane another process holds, as it last reported: its mark moves the watermark,
        and holds it back while the lane is not idle (one watermark across processes);
        ``hold_us`` (copies its process sent on and has not seen applied) holds it always."""
        if self._remote.get(lane) != (mark_us, idle, hold_us):
            self._remote[lane] = (mark_us, idle, hold_us)
            self._sum_remote()

    def forget_remote(self, lane: int) -> None:
        """A remote lane that this process now holds, or whose report expired."""
        if self._remote.pop(lane, None) is not None:
            self._sum_remote()

    def _sum_remote(self) -> None:
        marks = self._remote.values()
        self._remote_top = max((m for m, _, _ in marks), default=0)
        held = [m for m, idle, _ in marks if not idle]
        held += [h for _, _, h in marks if h is not None]
        self._remote_held = min(held, default=None)

    def observe(self, partition: int, ts_us: int, now: float) -> bool:
        """Advance ``partition``'s mark on an event seen at processing time ``now``.

        Returns whether the event is clock-skewed (it then moves nothing).
        """
        if ts_us > int(now * _US) + self.max_skew_us:
            return True
        if ts_us > self._marks.get(partition, 0):
            self._marks[partition] = ts_us
        return False

    def mark(self, partition: int) -> int:
        """The latest (unskewed) event time ``partition`` saw."""
        return self._marks.get(partition, 0)

    def has_mark(self, partition: int) -> bool:
        """Whether ``partition`` saw an (unskewed) event or had its mark restored."""
        return partition in self._marks

    def restore(self, partition: int, mark_us: int | None) -> None:
        """Put a mark back as it was (None: it had none), to undo a step."""
        if mark_us is None:
            self._marks.pop(partition, None)
        else:
            self._marks[partition] = mark_us

    def set_mark(self, partition: int, mark_us: int) -> None:
        """Restore a partition's mark (from its persisted state, or to undo a step)."""
        self._marks[partition] = mark_us

    def hold(self, partition: int, ts_us: int | None) -> None:
        """Hold the watermark at ``ts_us``: an event of that time is on its way to
        ``partition`` (a forwarded copy not yet applied); None releases it."""
        if ts_us is None:
            self._holds.pop(partition, None)
        else:
            self._holds[partition] = ts_us

    def held(self, partition: int) -> int | None:
        """The time ``hold`` holds ``partition`` at (None: none)."""
        return self._holds.get(partition)

    def holds(self) -> dict[int, int]:
        """Every hold: key (``forwarded_lane`` of a lane) -> the time it holds at."""
        return dict(self._holds)

    def behind(self, partition: int, behind: bool) -> None:
        """Whether ``partition`` still has records waiting (its mark holds the watermark)."""
        if behind:
            self._behind.add(partition)
        else:
            self._behind.discard(partition)

    def is_behind(self, partition: int) -> bool:
        """Whether ``partition`` was last reported with records waiting."""
        return partition in self._behind

    def forget(self, partition: int) -> None:
        """A partition this process no longer reads (revoked)."""
        self._marks.pop(partition, None)
        self._behind.discard(partition)
        self._holds.pop(partition, None)


class Delivery(Generic[E]):
    """One parsed record and where it came from (a Kafka position or a file line): an
    ``AgentEvent`` for the run semantics, a ``ChannelOperation`` for the channel ones.

    A plain class, not a dataclass: mypyc compiles no generic dataclass (``make compile``)."""

    __slots__ = ("event", "offset", "partition", "received_at", "source", "traceparent")

    def __init__(
        self,
        event: E,
        source: str,
        partition: int,
        offset: int,
        received_at: datetime,
        traceparent: str | None = None,
    ) -> None:
        self.event = event
        self.source = source
        self.partition = partition
        self.offset = offset
        self.received_at = received_at
        self.traceparent = traceparent

    def __repr__(self) -> str:
        return (
            f"Delivery(event={self.event!r}, source={self.source!r}, partition={self.partition}"
            f", offset={self.offset}, received_at={self.received_at!r}"
            f", traceparent={self.traceparent!r})"
        )


@dataclass(frozen=True, slots=True)
class OutRecord:
    """A record for an output topic: key, JSON value, headers."""

    key: bytes
    value: bytes
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class Forward:
    """A record that arrived off its home partition, to be produced to the repartition
    topic (schemas/CONTRACT.md, "Transport"): ``partition`` is the home (the partition the
    Java client's default partitioner gives ``key``), ``channel`` says which repartition
    topic (the channel operations' or the agent events'), ``key`` the routing key (runId;
    operationId, or connectionId for a denial), ``value`` the original bytes. ``headers``:
    ``source-topic``, ``source-partition``, ``source-offset`` and ``traceparent`` when the
    record had one. ``pattern`` names why it was off home (``producer_pattern``); ``ts_us``
    is its event time: until the copy is applied, its home may not let the watermark pass
    it (``Intake.hold``).

    Its source offset counts as handled (forwarded) once the copy is acknowledged; the copy
    is stepped on its home lane with ``forwarded=True`` and ends in the ledger, quarantine
    or the DLQ there (rule 15).
    """

    partition: int
    channel: bool
    key: bytes
    value: bytes
    headers: tuple[tuple[str, bytes], ...]
    source: tuple[str, int, int]
    pattern: str
    ts_us: int


@dataclass(frozen=True, slots=True)
class LimitDeath:
    """A run that closed after a run-limit breach: the input of the exhaustion alert.

    ``ts`` is its terminal's event time (rule 16). A run's death is sent again when it
    changes (a late lower-``seq`` terminal, a re-stated owner); ``retract`` says the run
    is no longer a limit death at all.
    """

    tenant_id: str
    axis: str
    run_id: str
    ts: datetime
    retract: bool = False


@dataclass(frozen=True, slots=True)
class LaneReport:
    """What one input lane tells the alerter about event time (rule 16).

    ``mark_us``: the latest event time the lane saw; ``pending_us``: the earliest terminal
    time of its runs still waiting to close (their deaths are still to come, so the
    watermark may not pass it); ``idle``: nothing waits on the lane's partition, so its
    mark holds nothing back; ``quiet``: idle for at least the allowed lateness in
    processing time (a stream that stopped: the alerter may decide up to the watermark);
    ``hold_us``: the earliest event time of the copies the reporting process forwarded to
    lanes other processes hold and has not seen applied yet: every process's watermark
    stays at it (``EventClock.remote``), idle or not, as the sender's own does.
    """

    mark_us: int
    pending_us: int | None = None
    idle: bool = False
    quiet: bool = False
    hold_us: int | None = None  # earliest copy this process sent to another's lane, in flight


@dataclass(slots=True)
class Output:
    """Everything one step produced: rows, topic records, deaths, state writes, counts.

    ``dlq`` holds records for the dead-letter topic; ``event_ts`` the event times (seconds)
    of the events applied, for freshness; ``ranges`` the source positions the rows came
    from (the writer's deduplication tokens name them; forwarded records' offsets included).
    ``forwards``: records for the repartition topics (an ``Intake`` that routes);
    ``forwarded`` counts them by source partition, ``patterns`` by producer pattern.
    """

    ledger: LedgerBatch = field(default_factory=LedgerBatch)
    quarantined: list[OutRecord] = field(default_factory=list)
    closed: list[OutRecord] = field(default_factory=list)
    alerts: list[OutRecord] = field(default_factory=list)
    dlq: list[OutRecord] = field(default_factory=list)
    limit_deaths: list[LimitDeath] = field(default_factory=list)
    state_writes: dict[str, bytes | None] = field(default_factory=dict)
    stats: Counter[str] = field(default_factory=Counter)
    event_ts: list[float] = field(default_factory=list)
    # (source, partition, first offset, last offset) the rows were derived from
    ranges: list[tuple[str, int, int, int]] = field(default_factory=list)
    forwards: list[Forward] = field(default_factory=list)
    forwarded: Counter[int] = field(default_factory=Counter)
    patterns: Counter[str] = field(default_factory=Counter)

    def extend(self, other: Output) -> None:
        self.ledger.extend(other.ledger)
        self.quarantined.extend(other.quarantined)
        self.closed.extend(other.closed)
        self.alerts.extend(other.alerts)
        self.dlq.extend(other.dlq)
        self.limit_deaths.extend(other.limit_deaths)
        self.state_writes.update(other.state_writes)
        self.stats.update(other.stats)
        self.event_ts.extend(other.event_ts)
        self.ranges.extend(other.ranges)
        self.forwards.extend(other.forwards)
        self.forwarded.update(other.forwarded)
        self.patterns.update(other.patterns)

    @property
    def records(self) -> int:
        """Topic records to produce (forwarded copies included)."""
        return (
            len(self.quarantined)
            + len(self.closed)
            + len(self.alerts)
            + len(self.dlq)
            + len(self.forwards)
        )
