"""``StateTable``: the core's state of file replays, stored in the ledger database itself.

``ingest-file`` loads it before a file and saves what changed after each stored batch, so
a backfill split into any number of files (and invocations) gives the ledger one file
gives. Rows are (key, value, version, deleted) in a ReplacingMergeTree: the highest
version wins, a deleted key leaves no value.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping

from clickhouse_connect.driver.client import Client

from prism.sinks._client import validate_identifier
from prism.sinks._writer import INSERT_SETTINGS

__all__ = ["STATE_TABLE", "StateTable"]

STATE_TABLE = "ingest_state"
_TABLE = STATE_TABLE


class StateTable:
    """Read and write the replayer's state (``Output.state_writes``) in ``<db>.ingest_state``."""

    def __init__(self, client: Client, database: str) -> None:
        self._client = client
        self._database = validate_identifier(database)
        self._version = time.time_ns()

    def load(self) -> Iterator[tuple[str, bytes]]:
        """Every stored (key, value)."""
        result = self._client.query(
            f"SELECT key, value FROM {self._database}.{_TABLE} FINAL WHERE NOT deleted"
        )
        for key, value in result.result_rows:
            yield str(key), value.encode() if isinstance(value, str) else bytes(value)

    def save(self, writes: Mapping[str, bytes | None]) -> None:
        """Store ``writes`` (None deletes a key) with a version above every earlier one."""
        if not writes:
            return
        self._version = max(self._version + 1, time.time_ns())
        rows = [
            [key, "" if value is None else value.decode(), self._version, value is None]
            for key, value in writes.items()
        ]
        self._client.insert(
            _TABLE,
            rows,
            column_names=["key", "value", "version", "deleted"],
            database=self._database,
            settings={k: v for k, v in INSERT_SETTINGS.items() if k != "insert_deduplicate"},
        )
