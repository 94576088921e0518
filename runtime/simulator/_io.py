"""Files: the fleet as JSONL (one record value per line) and the manifest as JSON."""

from __future__ import annotations

import os
from pathlib import Path

import orjson

from ._config import SimulatorError
from ._fleet import Fleet

__all__ = ["write_jsonl", "write_manifest"]


def write_jsonl(fleet: Fleet, path: str | os.PathLike[str]) -> int:
    """Write every delivered record's value on its own line; return the number of lines.

    Malformed values stay one line each (they never contain a raw newline), so a file
    replay delivers exactly the records a Kafka replay would.

    Example::

        write_jsonl(simulate(FleetConfig(runs=100)), "fleet.jsonl")
    """
    target = Path(path)
    with target.open("wb") as out:
        for n, rec in enumerate(fleet.records):
            if b"\n" in rec.value or b"\r" in rec.value:
                raise SimulatorError(
                    f"record {n} (run {rec.key.decode(errors='replace')}) contains a line break; "
                    "it cannot be written as one JSONL line"
                )
            out.write(rec.value)
            out.write(b"\n")
    return len(fleet.records)


def write_manifest(fleet: Fleet, path: str | os.PathLike[str]) -> None:
    """Write the ground-truth manifest as indented JSON with sorted keys.

    Example::

        write_manifest(fleet, "manifest.json")
    """
    data = orjson.dumps(fleet.manifest, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)
    Path(path).write_bytes(data + b"\n")
