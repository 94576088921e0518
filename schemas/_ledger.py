"""Rows of the ClickHouse ledger: the shapes the run-semantics core emits and ``sinks`` stores.

Each dataclass is one storage table; field names are column names, in column order.
Every row that can be re-stated later carries a ``version``: the storage table is a
ReplacingMergeTree keyed on the stable id, and the row with the highest version wins.
Equal versions carry equal content, so a replay that writes the same row again changes
nothing. Rows derived from one event (raw event, usage, turn, quarantine) also carry
``retracted``: when a later event shows the row should not count (a post-terminal event
found after it was written, a duplicate usage, an ownership change), the core writes the
same key again with a higher version and ``retracted=True``, and the views drop it
(schemas/CONTRACT.md rule 10). Nothing is ever mutated in place.

``None`` means absent (NULL in the ledger); 0 means a reported zero (CONTRACT.md rule 7).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

__all__ = [
    "AlertRow",
    "ChannelDenialRow",
    "ChannelOperationRow",
    "ChannelQuarantineRow",
    "ChannelWatermarkRow",
    "DeadLetterRow",
    "LedgerBatch",
    "ProgressRow",
    "QuarantineRow",
    "RawEventRow",
    "RunRow",
    "TurnRow",
    "UsageRow",
]


@dataclass(slots=True)
class RunRow:
    """One run's record (table ``runs_store``, key ``run_id``)."""

    run_id: str
    tenant_id: str | None
    account_id: str | None
    user_id: str | None
    session_id: str | None
    agent_id: str | None
    agent_definition_revision: str | None
    provider: str | None
    model: str | None
    parent_run_id: str | None
    delegation_id: str | None
    child_id: str | None
    bundle_digest: str | None
    status: str  # running|suspended|succeeded|failed|aborted|denied|incomplete
    terminal_type: str | None
    terminal_seq: int | None
    started_at: datetime | None
    finished_at: datetime | None
    last_event_at: datetime
    stop_reason: str | None
    stop_detail: str | None
    finish_reason: str | None
    error_code: str | None
    error_message: str | None
    failure_class: str | None
    abort_reason: str | None
    denied_reason: str | None
    model_turns: int
    deterministic_turns: int
    tool_calls: int
    cache_hit_rate: float | None
    exhaustion_limit: str | None
    exhaustion_maximum: float | None
    exhaustion_observed: float | None
    exhaustion_axis: str | None
    exhaustion_closest: str | None  # JSON array of {axis, used, maximum}
    missing_ranges: list[tuple[int, int]]  # inclusive seq ranges, at most 64 (rule 13)
    missing_count: int  # every missing seq, also beyond the stored ranges
    usage_mismatch: bool
    clock_skew: bool  # an event was stamped beyond the pipeline clock plus the skew (rule 14)
    event_count: int
    max_seq: int
    closed: bool  # the closed record was emitted (prism.runs.closed)
    timeline: str  # JSON: the run's timeline summary (as published on prism.runs.closed)
    version: int


@dataclass(slots=True)
class TurnRow:
    """One model or deterministic turn (``turns_store``, key ``(run_id, kind, turn, attempt)``)."""

    run_id: str
    kind: str  # model|deterministic
    turn: int
    attempt: int  # 0 for deterministic turns
    tenant_id: str | None
    provider: str | None
    model: str | None
    seq: int
    ts: datetime
    stop_reason: str | None
    latency_ms: float | None
    middleware: str | None
    tools_count: int | None
    tools_ids_hash: str | None
    input_tokens: int | None
    output_tokens: int | None
    total_tokens: int | None
    cache_read_tokens: int | None
    cache_write_tokens: int | None
    cache_hit_rate: float | None
    usage_source: str | None  # reported|estimated|None
    usage_confidence: str | None
    input_cap: int | None
    run_input_budget: int | None
    run_input_used: int | None
    max_turns: int | None
    version: int
    retracted: bool = False


@dataclass(slots=True)
class UsageRow:
    """One ``usage_recorded`` event (``usage_store``, key ``event_id``, highest version wins)."""

    event_id: str
    run_id: str
    seq: int
    tenant_id: str | None
    account_id: str | None
    provider: str | None
    model: str | None
    scope: str  # provider_turn|run_total
    turn: int | None
    attempt: int | None
    entry_id: str | None
    input_tokens: int | None
    output_tokens: int | None
    total_tokens: int | None
    cache_read_tokens: int | None
    cache_write_tokens: int | None
    cost: Decimal | None
    currency: str | None
    estimated: bool
    confidence: str | None
    recorded_at: datetime
    # an estimate for which a reported row of the same (run_id, turn, attempt) exists: the
    # core re-emits the estimate with superseded=True and a higher version when it sees both
    superseded: bool = False
    version: int = 1
    retracted: bool = False


@dataclass(slots=True)
class RawEventRow:
    """One accepted event of the raw log (table ``run_events_store``, key ``event_id``)."""

    event_id: str
    run_id: str
    seq: int
    type: str
    ts: datetime
    tenant_id: str | None
    account_id: str | None
    user_id: str | None
    session_id: str | None
    agent_id: str | None
    provider: str | None
    model: str | None
    parent_run_id: str | None
    bundle_digest: str | None
    payload: str  # JSON of ``data``
    traceparent: str | None
    source: str  # topic name, or "file:<path>"
    partition: int  # Kafka partition, -1 for a file
    offset: int  # Kafka offset, or the file's line number
    received_at: datetime
    version: int = 1
    retracted: bool = False


@dataclass(slots=True)
class QuarantineRow:
    """A valid event rejected by run semantics (table ``quarantine_store``, key ``event_id``)."""

    event_id: str
    run_id: str
    seq: int
    type: str
    ts: datetime
    tenant_id: str | None
    reason: str  # tenant_mismatch|duplicate_seq|post_terminal|conflicting_terminal|duplicate_usage
    payload: str  # JSON of the whole envelope
    source: str
    partition: int
    offset: int
    received_at: datetime
    version: int = 1
    retracted: bool = False


@dataclass(slots=True)
class DeadLetterRow:
    """A record that could not be parsed or violates the contract (table ``dead_letters_store``).

    Key ``(source, partition, offset)``: a Kafka position, or a file and line number. The
    ledger keeps the record's size, SHA-256 and a bounded, redacted preview
    (``dead_letter_preview``); the full bytes stay on the DLQ topic.
    """

    source: str
    partition: int
    offset: int
    code: str  # unparsable|contract_violation|oversized
    reason: str
    size: int  # bytes of the original record
    sha256: str  # hex SHA-256 of the original record
    preview: str  # at most 256 characters, deny-listed values and secrets masked
    received_at: datetime


@dataclass(slots=True)
class AlertRow:
    """An alert raised or resolved (table ``alerts_store``, key ``(alert_id, state)``).

    ``alert_id`` is the idempotency key: rule, key and window start; the firing and the
    resolved row of one alert are both kept, so the ledger shows when each happened.
    """

    alert_id: str
    rule: str  # run_limit_exhaustion|stale_run
    state: str  # firing|resolved
    tenant_id: str | None
    key: str  # the limit axis, or the run id for stale runs
    value: float
    threshold: float
    window_start: datetime
    window_end: datetime
    ts: datetime  # event time at which the state was reached
    message: str
    version: int


@dataclass(slots=True)
class ChannelOperationRow:
    """One channel operation's latest state (``channel_operations_store``, key ``operation_id``).

    ``version`` grows with the distinct records the operation has seen (and the stuck
    mark), never with how they were batched. ``stuck``: ``executing`` for longer than
    ``PRISM_CHANNEL_STUCK_SECONDS`` of event time. ``state`` is None while no record of the
    operation is a legal first state (e.g. ``executing`` arrived before ``admitted``).
    """

    operation_id: str
    connection_id: str
    tenant_id: str | None
    kind: str  # message|command|approval|notify
    state: str | None
    reason: str | None
    run_id: str | None
    session_id: str | None
    agent_id: str | None
    first_ts: datetime
    last_ts: datetime
    since: datetime  # when the current state was entered
    admitted_at: datetime | None
    delivered_at: datetime | None
    stuck: bool
    transitions: int  # accepted records (legal transitions)
    version: int


@dataclass(slots=True)
class ChannelDenialRow:
    """One accepted ``denied`` admission (``channel_denials_store``, key ``event_id``)."""

    event_id: str
    operation_id: str | None  # None: a denial without an operation (keyed by connection)
    ts: datetime
    connection_id: str
    tenant_id: str | None
    kind: str
    reason: str
    version: int
    retracted: bool = False


@dataclass(slots=True)
class ChannelQuarantineRow:
    """A valid channel record rejected by the operation semantics (``channel_quarantine_store``).

    Key ``event_id``; ``reason`` is ``illegal_transition`` or ``duplicate_seq``. A record
    that becomes legal once a lower ``seq`` arrives is written again ``retracted``.
    """

    event_id: str
    operation_id: str
    seq: int
    state: str
    ts: datetime
    connection_id: str
    tenant_id: str | None
    reason: str
    payload: str  # JSON of the whole record
    source: str
    partition: int
    offset: int
    received_at: datetime
    version: int
    retracted: bool = False


@dataclass(slots=True)
class ChannelWatermarkRow:
    """The pipeline's event-time watermark as the channel semantics saw it
    (``channel_watermark_store``): open items' ages are measured against its highest value."""

    key: str
    watermark: datetime
    version: int  # the watermark in microseconds: the highest row wins


@dataclass(slots=True)
class ProgressRow:
    """A worker's position on one source partition (table ``worker_progress_store``).

    Written by each worker every ``PRISM_PROGRESS_INTERVAL_SECONDS`` for the partitions it
    holds, so dashboards chart consumer lag from the ledger like every other figure.
    """

    ts: datetime  # processing time of the sample
    worker: str  # host:pid of the worker process
    source: str  # the source topic
    partition: int
    processed: int  # the next offset the worker has stored in the ledger
    end_offset: int  # the partition's end offset (high watermark) as the worker saw it
    lag: int  # records not yet in the ledger: end_offset - processed, at least 0
    last_batch_at: datetime | None  # when the worker last stored a batch of any partition


@dataclass(slots=True)
class LedgerBatch:
    """All rows produced for one input batch; the writer inserts one INSERT per non-empty table."""

    runs: list[RunRow] = field(default_factory=list)
    turns: list[TurnRow] = field(default_factory=list)
    usage: list[UsageRow] = field(default_factory=list)
    events: list[RawEventRow] = field(default_factory=list)
    quarantine: list[QuarantineRow] = field(default_factory=list)
    dead_letters: list[DeadLetterRow] = field(default_factory=list)
    alerts: list[AlertRow] = field(default_factory=list)
    channel_operations: list[ChannelOperationRow] = field(default_factory=list)
    channel_denials: list[ChannelDenialRow] = field(default_factory=list)
    channel_quarantine: list[ChannelQuarantineRow] = field(default_factory=list)
    channel_watermarks: list[ChannelWatermarkRow] = field(default_factory=list)
    progress: list[ProgressRow] = field(default_factory=list)

    def extend(self, other: LedgerBatch) -> None:
        for name in self.__dataclass_fields__:
            getattr(self, name).extend(getattr(other, name))

    def __len__(self) -> int:
        return sum(len(getattr(self, name)) for name in self.__dataclass_fields__)
