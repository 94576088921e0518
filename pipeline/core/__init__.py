"""The run-semantics core: pure, synchronous, deterministic (schemas/CONTRACT.md, "Semantics").

No Kafka, no ClickHouse, no asyncio. Every shell (the faust worker, ``ingest-file``,
``rebuild``, tests) feeds records to one ``Intake`` and persists what its ``Output``
says: ledger rows, topic records, state writes.

Example::

    intake = Intake(CoreConfig(grace_period_s=30))
    out = intake.step(0, [InRecord(value, "prism.agent-events", 0, 42)], now=time.time())
    out.ledger.runs        # RunRow updates for touched runs
    out.closed             # prism.runs.closed records
    out.dlq                # dead-letter records of what did not parse
    intake.commit(0)       # once the rows are stored (or intake.rollback(0))
    intake.finalize(now)   # at the end of a file replay
"""

from ._alerts import (
    RULE_EXHAUSTION,
    RULE_STALE,
    ExhaustionAlerter,
    alert_record,
    death_record,
    decode_alerter_input,
    watermark_record,
)
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
from ._run import RunState
from ._types import CoreConfig, Delivery, EventClock, LimitDeath, Output, OutRecord

__all__ = [
    "QUARANTINE_REASONS",
    "RULE_EXHAUSTION",
    "RULE_STALE",
    "Classified",
    "CoreConfig",
    "Delivery",
    "EventClock",
    "ExhaustionAlerter",
    "InRecord",
    "Intake",
    "LimitDeath",
    "OutRecord",
    "Output",
    "PermanentStoreError",
    "Processor",
    "RunState",
    "alert_record",
    "classify",
    "dead_letter_row",
    "death_record",
    "decode_alerter_input",
    "dlq_record",
    "seq_gaps",
    "store_isolating",
    "watermark_record",
]
