"""Replay consumers: tail one run or every run from Kafka, replay a run from the ledger, rebuild;
tail one channel operation (``tail_operation``).

Every consumer ends on the terminal as the contract defines it: a run ends at its terminal
event with the lowest ``seq`` and is complete once every lower ``seq`` arrived; duplicates
(same ``eventId`` or ``(runId, seq)``) are shown once and post-terminal events never.
None of them joins a consumer group or commits offsets.

Example::

    from prism.pipeline.replay import format_event, tail_run
    from prism.pipeline.settings import load_settings

    result = await tail_run(load_settings(), "run-42", lambda ev: print(format_event(ev)))
    if not result.complete:
        print(result.describe())          # "... missing seqs: 4, 7-9 ..."
"""

from ._errors import RebuildRefused, ReplayError, RunNotFound, TopicNotFound
from ._events import FORMATS, ReplayEvent, event_from_ledger_row, event_from_record, format_event
from ._ledger import ledger_start_offset, replay_from_ledger
from ._operation import OperationResult, OperationSequencer, format_operation, tail_operation
from ._rebuild import RebuildSummary, rebuild
from ._sequencer import RunSequencer, TailResult, format_seqs
from ._tail import FollowResult, follow, partition_for, tail_run, topic_partitions

__all__ = [
    "FORMATS",
    "FollowResult",
    "OperationResult",
    "OperationSequencer",
    "RebuildRefused",
    "RebuildSummary",
    "ReplayError",
    "ReplayEvent",
    "RunNotFound",
    "RunSequencer",
    "TailResult",
    "TopicNotFound",
    "event_from_ledger_row",
    "event_from_record",
    "follow",
    "format_event",
    "format_operation",
    "format_seqs",
    "ledger_start_offset",
    "partition_for",
    "rebuild",
    "replay_from_ledger",
    "tail_operation",
    "tail_run",
    "topic_partitions",
]
