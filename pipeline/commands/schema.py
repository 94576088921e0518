"""``prism-pipeline schema export|check``: the contract's committed JSON Schema files."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from prism.schemas import EVENT_JSON_SCHEMA_PATH, JSON_SCHEMA_FILES

_DEFAULT_DIR = EVENT_JSON_SCHEMA_PATH.parent


def register(sub: argparse._SubParsersAction) -> None:
    names = ", ".join(path.name for path, _ in JSON_SCHEMA_FILES.values())
    p = sub.add_parser(
        "schema",
        help="export or check the JSON Schema files of the wire contract",
        description=(
            "Writes (export) or verifies (check) the Draft 2020-12 JSON Schemas generated "
            "from the pydantic models in schemas/: one file per contract family "
            f"({names}). check exits 1 when a file is missing or differs from what export "
            "would write."
        ),
    )
    p.add_argument("action", choices=["export", "check"])
    p.add_argument(
        "--dir",
        type=Path,
        default=_DEFAULT_DIR,
        help="directory of the schema files (default: the schemas/ package directory)",
    )
    p.add_argument(
        "--family",
        choices=sorted(JSON_SCHEMA_FILES),
        action="append",
        help="only this contract family (repeatable; default: every family)",
    )
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    families = args.family or list(JSON_SCHEMA_FILES)
    failed = 0
    for family in families:
        default_path, render = JSON_SCHEMA_FILES[family]
        path: Path = args.dir / default_path.name
        text = render()
        if args.action == "export":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path} ({len(text.encode())} bytes)")
            continue
        try:
            current = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            print(f"{path} is missing; run: prism-pipeline schema export", file=sys.stderr)
            failed += 1
            continue
        if current != text:
            print(
                f"{path} is stale: it differs from the schemas/ models; "
                "run: prism-pipeline schema export (and commit the file)",
                file=sys.stderr,
            )
            failed += 1
        else:
            print(f"{path} is up to date")
    return 1 if failed else 0
