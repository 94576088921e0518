"""``prism-pipeline schema export|check``: the event contract's committed JSON Schema file."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from prism.schemas import EVENT_JSON_SCHEMA_PATH, render_event_json_schema


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "schema",
        help="export or check the JSON Schema of the event contract",
        description=(
            "Writes (export) or verifies (check) the Draft 2020-12 JSON Schema of "
            "prism.agent-event/v1 generated from the pydantic models in schemas/. "
            "check exits 1 when the file differs from what export would write."
        ),
    )
    p.add_argument("action", choices=["export", "check"])
    p.add_argument(
        "--out",
        type=Path,
        default=EVENT_JSON_SCHEMA_PATH,
        help=f"schema file to write or check (default {EVENT_JSON_SCHEMA_PATH.name} in schemas/)",
    )
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    text = render_event_json_schema()
    path: Path = args.out
    if args.action == "export":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path} ({len(text.encode())} bytes)")
        return 0
    try:
        current = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        print(f"{path} is missing; run: prism-pipeline schema export", file=sys.stderr)
        return 1
    if current != text:
        print(
            f"{path} is stale: it differs from the schemas/ models; "
            "run: prism-pipeline schema export (and commit the file)",
            file=sys.stderr,
        )
        return 1
    print(f"{path} is up to date")
    return 0
