"""The repository keeps its own copy of the wire contract, identical to the shared one."""

from __future__ import annotations

from pathlib import Path

from prism import schemas

REPO_COPY = Path(schemas.__file__).with_name("CONTRACT.md")
SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "CONTRACT.md"
TITLE = b"# The event contract"


def test_schemas_contract_md_is_the_shared_contract_byte_for_byte() -> None:
    copy = REPO_COPY.read_bytes()
    assert copy.startswith(TITLE), f"{REPO_COPY} does not start with its title line"
    # The copy defines both families the code implements.
    for schema_id in (schemas.SCHEMA_ID, schemas.CHANNEL_SCHEMA_ID):
        assert schema_id.encode() in copy, f"{REPO_COPY} does not define {schema_id}"
    if SHARED.exists():  # beside a checkout: the copy must be current
        assert copy == SHARED.read_bytes(), (
            f"{REPO_COPY} differs from {SHARED}: copy it (cp {SHARED} {REPO_COPY}) and commit"
        )
