"""The ledger side of replay: where a run starts on Kafka; a run replayed from ``run_events``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._errors import ReplayError, RunNotFound
from ._events import ReplayEvent, event_from_ledger_row
from ._sequencer import RunSequencer, TailResult

__all__ = ["ledger_start_offset", "replay_from_ledger"]


def _check_identifier(database: str) -> None:
    from prism.sinks import LedgerConfigError
    from prism.sinks._client import validate_identifier

    try:
        validate_identifier(database)
    except LedgerConfigError as exc:
        raise ReplayError(f"{exc}; pass the ledger database, e.g. --database prism") from None


def ledger_start_offset(
    client: Any, database: str, topic: str, partition: int, run_id: str
) -> int | None:
    """The lowest offset of ``topic[partition]`` the ledger recorded for ``run_id``, if any.

    Example::

        ledger_start_offset(client, "prism", "prism.agent-events", 3, "run-42")   # 1187 or None
    """
    from prism.sinks import query

    _check_identifier(database)
    result = query(
        client,
        f"SELECT count(), min(`offset`) FROM {database}.run_events "
        "WHERE run_id = {run_id:String} AND source = {topic:String} AND `partition` = {p:Int32}",
        {"run_id": run_id, "topic": topic, "p": partition},
    )
    count, first = result.rows[0]
    return int(first) if count else None


def replay_from_ledger(
    client: Any, database: str, run_id: str, on_event: Callable[[ReplayEvent], None]
) -> TailResult:
    """Replay a run from the ledger's raw event log, in seq order, ending on its terminal.

    For runs Kafka no longer holds. The same ending rule as the Kafka tail applies; the
    ledger is static, so a run that is not complete ends at once with its gaps listed
    (what lies behind a gap is still passed, in seq order). ``RunNotFound`` when the
    ledger holds no event of the run.

    Example::

        result = replay_from_ledger(client, "prism", "run-42", lambda ev: print(ev.seq))
        result.complete, result.missing
    """
    from prism.sinks import query

    _check_identifier(database)
    result = query(
        client,
        f"SELECT * FROM {database}.run_events WHERE run_id = {{run_id:String}} "
        "ORDER BY seq, `offset`, event_id",
        {"run_id": run_id},
    )
    if not result.rows:
        raise RunNotFound(
            f"the ledger database {database!r} has no event of run {run_id!r} in run_events; "
            "check the run id and --database, or tail it from Kafka (without --from-ledger)"
        )
    seq = RunSequencer(run_id)
    for row in result.dicts():
        for ready in seq.push(event_from_ledger_row(row)):
            on_event(ready)
    for ready in seq.drain():
        on_event(ready)
    return seq.result()
