"""Every simulated event is valid under the committed JSON Schema and the pydantic contract."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import jsonschema
import orjson
import pytest

from prism import schemas
from prism.runtime.simulator import Fleet, FleetConfig, simulate

SCHEMA_FILE = Path(schemas.__file__).parent / "prism-agent-event.v1.schema.json"


@pytest.fixture(scope="module")
def fleet() -> Fleet:
    # >= 200 runs: every scenario is present; every chaos kind is on.
    return simulate(
        FleetConfig(
            runs=200,
            seed=21,
            duplicates=0.02,
            reorder_window=2,
            post_terminal=0.03,
            conflicting_terminals=0.03,
            malformed=0.03,
            oversized=0.01,
        )
    )


@pytest.fixture(scope="module")
def validator() -> jsonschema.protocols.Validator:
    assert SCHEMA_FILE.exists(), f"{SCHEMA_FILE} is missing; run `prism-pipeline schema export`"
    schema = json.loads(SCHEMA_FILE.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def test_every_valid_event_passes_the_json_schema(
    fleet: Fleet, validator: jsonschema.protocols.Validator
) -> None:
    failures = Counter()
    for ev in fleet.events:
        for err in validator.iter_errors(ev):
            failures[f"{ev['type']}: {err.json_path}: {err.message[:120]}"] += 1
    assert not failures, failures.most_common(10)
    assert len({ev["type"] for ev in fleet.events}) >= 19  # all contract types + an unknown one


def test_every_valid_record_parses_with_the_contract(fleet: Fleet) -> None:
    values = [r.value for r in fleet.records if r.kind == "valid"]
    results = schemas.parse_batch(values)
    bad = [r.reason for r in results if isinstance(r, schemas.ContractViolation)]
    assert bad == []
    unknown = [r for r in results if isinstance(r, schemas.UnknownEvent)]
    assert unknown and {r.type for r in unknown} == {"memory_compacted"}


def test_chaos_records_are_rejected_with_the_kind_the_manifest_counts(
    fleet: Fleet, validator: jsonschema.protocols.Validator
) -> None:
    bad = [r for r in fleet.records if r.kind != "valid"]
    assert {r.kind for r in bad} == {"unparsable", "contract_violation", "oversized"}
    for rec, result in zip(bad, schemas.parse_batch([r.value for r in bad]), strict=True):
        assert isinstance(result, schemas.ContractViolation), rec.note
        assert result.code == rec.kind, (rec.note, result.reason)
        if rec.kind == "contract_violation":
            assert not validator.is_valid(orjson.loads(rec.value)), rec.note
    counted = fleet.manifest["dlq"]
    assert sum(counted.values()) == len(bad)
