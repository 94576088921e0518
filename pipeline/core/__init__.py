"""The run-semantics core: pure, synchronous, deterministic (schemas/CONTRACT.md, "Semantics").

No Kafka, no ClickHouse, no asyncio. Every shell (the Kafka worker, ``ingest-file``,
``rebuild``, tests) feeds records to one ``Intake`` and persists what its ``Output``
says: ledger rows, topic records, state writes.

Example::

    intake = Intake(CoreConfig(grace_period_s=30))
    out = intake.step(0, [InRecord(value, "prism.agent-events", 0, 42)], now=time.time())
    out.ledger.runs        # RunRow updates for touched runs
    out.closed             # prism.runs.closed records
    out.dlq                # dead-letter records of what did not parse
    out.forwards           # records off their run's home partition (Intake(route_partitions=n))
    intake.commit(0)       # once the rows are stored (or intake.rollback(0))
    intake.finalize(now)   # at the end of a file replay
"""

# First: the core's modules may come from the mypyc build (``make compile``; PRISM_CORE
# chooses, and schemas/_compiled.py says how).
from prism.schemas._compiled import use_compiled as _use_compiled

COMPILED = _use_compiled(__path__, __name__)  # True: the mypyc build runs

from ._alerts import (
    RULE_EXHAUSTION,
    RULE_STALE,
    ExhaustionAlerter,
    alert_record,
    death_record,
    decision_time,
    decode_alerter_input,
    lane_record,
    reports_watermark,
)
from ._channel_state import DUPLICATE_SEQ as _DUPLICATE_SEQ
from ._channel_state import ILLEGAL_TRANSITION as _ILLEGAL_TRANSITION
from ._channel_state import OperationState, judge
from ._channels import WATERMARK_KEY, ChannelProcessor
from ._classify import QUARANTINE_REASONS, Classified, classify, seq_gaps
from ._intake import (
    InRecord,
    Intake,
    PermanentStoreError,
    dead_letter_row,
    dlq_record,
    store_isolating,
)
from ._processor import Processor
from ._route import PRODUCER_PATTERNS, home_partition, murmur2, producer_pattern
from ._run import RunState
from ._stateformat import STATE_FORMAT, StateFormatError, StateKey
from ._types import (
    CoreConfig,
    Delivery,
    EventClock,
    Forward,
    LaneReport,
    LimitDeath,
    Output,
    OutRecord,
    lane_of_forwarded,
)

CHANNEL_QUARANTINE_REASONS = (_ILLEGAL_TRANSITION, _DUPLICATE_SEQ)
"""Why a valid channel-operation record is quarantined (schemas/CONTRACT.md)."""

__all__ = [
    "CHANNEL_QUARANTINE_REASONS",
    "COMPILED",
    "PRODUCER_PATTERNS",
    "QUARANTINE_REASONS",
    "RULE_EXHAUSTION",
    "RULE_STALE",
    "STATE_FORMAT",
    "WATERMARK_KEY",
    "ChannelProcessor",
    "Classified",
    "CoreConfig",
    "Delivery",
    "EventClock",
    "ExhaustionAlerter",
    "Forward",
    "InRecord",
    "Intake",
    "LaneReport",
    "LimitDeath",
    "OperationState",
    "OutRecord",
    "Output",
    "PermanentStoreError",
    "Processor",
    "RunState",
    "StateFormatError",
    "StateKey",
    "alert_record",
    "classify",
    "dead_letter_row",
    "death_record",
    "decision_time",
    "decode_alerter_input",
    "dlq_record",
    "home_partition",
    "judge",
    "lane_of_forwarded",
    "lane_record",
    "murmur2",
    "producer_pattern",
    "reports_watermark",
    "seq_gaps",
    "store_isolating",
]
