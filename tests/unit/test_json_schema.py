"""The exported JSON Schema: committed file current, valid Draft 2020-12, agrees with pydantic."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from prism.pipeline.cli import main
from prism.schemas import (
    CHANNEL_JSON_SCHEMA_ID,
    CHANNEL_JSON_SCHEMA_PATH,
    CHANNEL_SCHEMA_ID,
    EVENT_JSON_SCHEMA_ID,
    EVENT_JSON_SCHEMA_PATH,
    SCHEMA_ID,
    channel_json_schema,
    event_json_schema,
    render_channel_json_schema,
    render_event_json_schema,
)
from tests.fixtures.events import DROP, EVENT_TYPES, make_event
from tests.unit.test_schemas_rules import CASES, Case, case_id


@pytest.fixture(scope="module")
def validator() -> Draft202012Validator:
    schema = json.loads(EVENT_JSON_SCHEMA_PATH.read_text(encoding="utf-8"))
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def test_committed_schema_file_is_up_to_date() -> None:
    committed = EVENT_JSON_SCHEMA_PATH.read_text(encoding="utf-8")
    assert committed == render_event_json_schema(), (
        f"{EVENT_JSON_SCHEMA_PATH} is stale: run `prism-pipeline schema export` and commit it"
    )


def test_schema_is_a_valid_draft_2020_12_schema_with_identity() -> None:
    schema = event_json_schema()
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"] == EVENT_JSON_SCHEMA_ID
    assert SCHEMA_ID in schema["title"]
    assert schema["description"]
    assert schema["properties"]["schema"]["const"] == SCHEMA_ID


@pytest.mark.parametrize("type_", EVENT_TYPES)
def test_every_contract_type_validates(validator: Draft202012Validator, type_: str) -> None:
    errors = [e.message for e in validator.iter_errors(make_event(type_))]
    assert errors == []


def test_unknown_types_validate_with_any_object_data(validator: Draft202012Validator) -> None:
    event = make_event("agent_thought_logged", anything={"goes": [1, None]})
    assert list(validator.iter_errors(event)) == []
    assert list(validator.iter_errors(make_event("agent_thought_logged", envelope={"data": 3})))


def test_unknown_fields_are_allowed(validator: Draft202012Validator) -> None:
    event = make_event("agent_started", envelope={"producerVersion": "9"}, futureField=1)
    assert list(validator.iter_errors(event)) == []


@pytest.mark.parametrize("case", [c for c in CASES if c.error is None], ids=case_id)
def test_schema_accepts_what_pydantic_accepts(validator: Draft202012Validator, case: Case) -> None:
    assert [e.message for e in validator.iter_errors(case.event)] == []


@pytest.mark.parametrize(
    "case", [c for c in CASES if c.error is not None and c.json_schema_rejects], ids=case_id
)
def test_schema_rejects_what_it_can_express(validator: Draft202012Validator, case: Case) -> None:
    assert list(validator.iter_errors(case.event)), f"{case.id} should be rejected"


@pytest.mark.parametrize(
    ("event", "fragment"),
    [
        (make_event("agent_started", envelope={"seq": -1}), "less than the minimum"),
        (make_event("agent_started", envelope={"ts": "2025-01-31 12:00:00"}), "does not match"),
        (make_event("provider_turn_finished", stopReason="length"), "is not one of"),
        (
            make_event("usage_recorded", usage={"estimated": True, "cost": "1"}),
            "not of type 'null'",
        ),
        (make_event("usage_recorded", turn=DROP), "'turn' is a required property"),
    ],
)
def test_rejections_explain_themselves(
    validator: Draft202012Validator, event: dict[str, Any], fragment: str
) -> None:
    messages = [e.message for e in validator.iter_errors(event)]
    assert any(fragment in m for m in messages), messages


def test_cli_export_writes_and_check_detects_staleness(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "nested"
    assert main(["schema", "check", "--dir", str(out)]) == 1  # missing
    assert main(["schema", "export", "--dir", str(out)]) == 0
    agent = out / EVENT_JSON_SCHEMA_PATH.name
    channel = out / CHANNEL_JSON_SCHEMA_PATH.name
    assert agent.read_text(encoding="utf-8") == render_event_json_schema()
    assert channel.read_text(encoding="utf-8") == render_channel_json_schema()
    assert main(["schema", "check", "--dir", str(out)]) == 0
    capsys.readouterr()
    channel.write_text(channel.read_text(encoding="utf-8").replace("1..128", "1..64"), "utf-8")
    assert main(["schema", "check", "--dir", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"{channel} is stale" in err and str(agent) not in err
    assert main(["schema", "check", "--dir", str(out), "--family", "agent-event"]) == 0


def test_committed_channel_schema_file_is_up_to_date() -> None:
    committed = CHANNEL_JSON_SCHEMA_PATH.read_text(encoding="utf-8")
    assert committed == render_channel_json_schema(), (
        f"{CHANNEL_JSON_SCHEMA_PATH} is stale: run `prism-pipeline schema export` and commit it"
    )
    assert CHANNEL_JSON_SCHEMA_PATH.parent == EVENT_JSON_SCHEMA_PATH.parent


def test_channel_schema_is_a_valid_draft_2020_12_schema_with_identity() -> None:
    schema = channel_json_schema()
    Draft202012Validator.check_schema(schema)
    assert schema["$id"] == CHANNEL_JSON_SCHEMA_ID != EVENT_JSON_SCHEMA_ID
    assert schema["properties"]["schema"]["const"] == CHANNEL_SCHEMA_ID
    assert set(schema["required"]) == {
        "schema",
        "eventId",
        "seq",
        "ts",
        "connectionId",
        "kind",
        "state",
    }
