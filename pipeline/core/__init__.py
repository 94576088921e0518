"""The run-semantics core: pure, synchronous, deterministic (CONTRACT.md, "Semantics").

No Kafka, no ClickHouse, no asyncio: shells (the faust worker, the file replayer, tests)
feed ``Delivery`` batches to a ``Processor`` and persist what its ``Output`` says.

Example::

    proc = Processor(CoreConfig(grace_period_s=30))
    out = proc.process([Delivery(event, "prism.agent-events", 0, 42, received_at)], now=time.time())
    out.ledger.runs        # RunRow updates for touched runs
    out.closed             # prism.runs.closed records
    out.finalize(...)      # at the end of a file replay
"""

from ._alerts import ExhaustionAlerter, alert_record
from ._processor import Processor
from ._run import RunState
from ._types import CoreConfig, Delivery, LimitDeath, Output, OutRecord

__all__ = [
    "CoreConfig",
    "Delivery",
    "ExhaustionAlerter",
    "LimitDeath",
    "OutRecord",
    "Output",
    "Processor",
    "RunState",
    "alert_record",
]
