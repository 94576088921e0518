"""Plain data passed in and out of the core: configuration, deliveries, outputs."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from prism.schemas import LedgerBatch

__all__ = ["CoreConfig", "Delivery", "LimitDeath", "OutRecord", "Output"]


@dataclass(frozen=True, slots=True)
class CoreConfig:
    """Run-semantics knobs (CONTRACT.md rules 2 and 4; issue defaults)."""

    grace_period_s: float = 30.0
    stale_after_s: float = 3600.0
    tombstone_retention_s: float = 86400.0
    alert_window_s: float = 300.0
    alert_threshold: int = 5

    def __post_init__(self) -> None:
        for name in ("grace_period_s", "stale_after_s", "tombstone_retention_s", "alert_window_s"):
            value = getattr(self, name)
            if value < 0:
                raise ValueError(f"CoreConfig.{name} must be >= 0, got {value!r}")
        if self.alert_threshold < 1:
            raise ValueError(f"CoreConfig.alert_threshold must be >= 1, got {self.alert_threshold}")


@dataclass(slots=True)
class Delivery:
    """One parsed event and where it came from (a Kafka position or a file line)."""

    event: Any  # schemas.AgentEvent
    source: str
    partition: int
    offset: int
    received_at: datetime
    traceparent: str | None = None


@dataclass(frozen=True, slots=True)
class OutRecord:
    """A record for an output topic: key, JSON value, headers."""

    key: bytes
    value: bytes
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class LimitDeath:
    """A run that closed after a run-limit breach: the input of the exhaustion alert."""

    tenant_id: str
    axis: str
    run_id: str
    ts: datetime


@dataclass(slots=True)
class Output:
    """Everything one ``process`` call produced."""

    ledger: LedgerBatch = field(default_factory=LedgerBatch)
    quarantined: list[OutRecord] = field(default_factory=list)
    closed: list[OutRecord] = field(default_factory=list)
    alerts: list[OutRecord] = field(default_factory=list)
    limit_deaths: list[LimitDeath] = field(default_factory=list)
    state_writes: dict[str, bytes | None] = field(default_factory=dict)
    stats: Counter[str] = field(default_factory=Counter)

    def extend(self, other: Output) -> None:
        self.ledger.extend(other.ledger)
        self.quarantined.extend(other.quarantined)
        self.closed.extend(other.closed)
        self.alerts.extend(other.alerts)
        self.limit_deaths.extend(other.limit_deaths)
        self.state_writes.update(other.state_writes)
        self.stats.update(other.stats)
