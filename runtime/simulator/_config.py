"""Fleet configuration (size, seed, clock, chaos knobs) and the simulator's exceptions.

Exception hierarchy::

    SimulatorError (ValueError)
    ├── SimulatorConfigError     a FleetConfig value is out of range
    └── SimulatorPublishError    the fleet could not be delivered to Kafka
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

__all__ = [
    "DEFAULT_START",
    "FLEET_SPAN",
    "FleetConfig",
    "SimulatorConfigError",
    "SimulatorError",
    "SimulatorPublishError",
]

DEFAULT_START = datetime(2026, 11, 30, tzinfo=UTC)
# Runs start spread over this much event time (never-finishing "fresh" runs close it).
FLEET_SPAN = timedelta(hours=3)
_MAX_RUNS = 10_000_000


class SimulatorError(ValueError):
    """Base of every error the fleet simulator raises."""


class SimulatorConfigError(SimulatorError):
    """A FleetConfig value is out of range; the message names the field and the value."""


class SimulatorPublishError(SimulatorError, RuntimeError):
    """Publishing the fleet to Kafka failed; the message names the broker and topic."""


_PROBABILITIES = (
    "duplicates",
    "post_terminal",
    "conflicting_terminals",
    "malformed",
    "oversized",
    "hostile",
    "guardrail_denials",
)
_MAX_CHANNEL_OPERATIONS = 1_000_000


@dataclass(frozen=True, slots=True)
class FleetConfig:
    """What fleet to simulate: size, seed, event-time origin and chaos knobs (all off by default).

    Probabilities: ``duplicates`` per delivered record; ``post_terminal``,
    ``conflicting_terminals``, ``malformed``, ``oversized``, ``hostile`` and
    ``guardrail_denials`` per run. ``reorder_window`` lets a run's records move up to K
    positions (never past its terminal). ``hostile`` runs get one of: a post-terminal usage
    row delivered before the terminal, a late tenant, a producer clock in 2199, another
    tenant's run reusing their run id, a second report of one turn's usage, or (runs
    without a terminal) a run id on a partition that then goes quiet (of ``partitions``).
    ``limit_death_burst`` makes that many runs of one tenant die on one limit axis within
    a few minutes (the exhaustion alert fires at ``alert_threshold`` deaths in
    ``alert_window_seconds``). ``channel_operations`` adds that many messaging-channel
    operations (``prism.channel-operations``) with the seeds' failure modes.

    The manifest judges event time with the pipeline clock ``processing_clock`` (default:
    the fleet's last delivery time) and ``max_clock_skew_seconds``; the pipeline being
    checked must use the same clock.

    Example::

        FleetConfig(runs=500, seed=7, duplicates=0.02, reorder_window=3, hostile=0.02)
    """

    runs: int = 1000
    seed: int = 0
    start: datetime | None = None
    clock: Literal["fixed", "wall"] = "fixed"
    duplicates: float = 0.0
    reorder_window: int = 0
    post_terminal: float = 0.0
    conflicting_terminals: float = 0.0
    malformed: float = 0.0
    oversized: float = 0.0
    hostile: float = 0.0
    guardrail_denials: float = 0.0
    limit_death_burst: int = 0
    channel_operations: int = 0
    partitions: int = 4
    stale_after_seconds: float = 3600.0
    max_event_bytes: int = 1_048_576
    processing_clock: datetime | None = None
    max_clock_skew_seconds: float = 300.0
    alert_window_seconds: float = 300.0
    alert_threshold: int = 5
    channel_stuck_seconds: float = 300.0
    _resolved_start: datetime = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.runs, bool) or not isinstance(self.runs, int):
            raise SimulatorConfigError(f"runs must be an integer, got {self.runs!r}")
        if not 1 <= self.runs <= _MAX_RUNS:
            raise SimulatorConfigError(
                f"runs={self.runs} is out of range; use 1..{_MAX_RUNS:,} runs per fleet"
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise SimulatorConfigError(f"seed must be an integer, got {self.seed!r}")
        for name in _PROBABILITIES:
            value = getattr(self, name)
            if not isinstance(value, int | float) or math.isnan(value) or not 0 <= value <= 1:
                raise SimulatorConfigError(
                    f"{name}={value!r} is not a probability; use a number in [0, 1]"
                )
        if not isinstance(self.reorder_window, int) or not 0 <= self.reorder_window <= 1000:
            raise SimulatorConfigError(
                f"reorder_window={self.reorder_window!r} is out of range; use 0..1000 positions"
            )
        if self.clock not in ("fixed", "wall"):
            raise SimulatorConfigError(f"clock={self.clock!r} is unknown; use 'fixed' or 'wall'")
        if self.start is not None and self.start.utcoffset() is None:
            raise SimulatorConfigError(
                f"start={self.start.isoformat()} has no UTC offset; give one, e.g. "
                "2026-11-30T00:00:00+00:00"
            )
        for name in (
            "stale_after_seconds",
            "max_clock_skew_seconds",
            "alert_window_seconds",
            "channel_stuck_seconds",
        ):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not 0 < value <= 365 * 86_400:
                raise SimulatorConfigError(
                    f"{name}={value!r} is out of range; use a number of seconds in (0, 31536000]"
                )
        self._check_counts()
        if self.processing_clock is not None and self.processing_clock.utcoffset() is None:
            raise SimulatorConfigError(
                f"processing_clock={self.processing_clock.isoformat()} has no UTC offset"
            )
        if not 1024 <= self.max_event_bytes <= 64 * 1_048_576:
            raise SimulatorConfigError(
                f"max_event_bytes={self.max_event_bytes!r} is out of range; use 1024..64 MiB"
            )
        object.__setattr__(self, "_resolved_start", self._compute_start())

    def _check_counts(self) -> None:
        bounds = {
            "limit_death_burst": (0, self.runs),
            "channel_operations": (0, _MAX_CHANNEL_OPERATIONS),
            "partitions": (1, 10_000),
            "alert_threshold": (1, 1_000_000),
        }
        for name, (lo, hi) in bounds.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
                raise SimulatorConfigError(
                    f"{name}={value!r} is out of range; use an integer in {lo}..{hi:,}"
                )
        if self.hostile and self.partitions < 2:
            raise SimulatorConfigError(
                f"hostile={self.hostile} needs partitions >= 2 (a quiet partition beside the "
                f"busy ones), got partitions={self.partitions}"
            )

    def _compute_start(self) -> datetime:
        if self.start is not None:
            start = self.start.astimezone(UTC)
        elif self.clock == "wall":
            # The fleet's event time then ends close to now (live dashboards show it).
            now = datetime.now(UTC).replace(microsecond=0)
            start = now - FLEET_SPAN - timedelta(minutes=10)
        else:
            start = DEFAULT_START
        return start.replace(microsecond=(start.microsecond // 1000) * 1000)

    @property
    def resolved_start(self) -> datetime:
        """The fleet's event-time origin (explicit ``start``, wall clock, or the fixed default)."""
        return self._resolved_start

    def knobs(self) -> dict[str, Any]:
        """The chaos knobs as a plain dict (recorded in the manifest)."""
        data = asdict(self)
        names = (*_PROBABILITIES, "reorder_window", "limit_death_burst", "channel_operations")
        return {name: data[name] for name in names}
