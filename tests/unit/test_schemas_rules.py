"""Each rule of the event contract, with a valid and an invalid example (parsed from bytes).

``CASES`` is shared with the JSON Schema tests: the exported schema must agree with
pydantic on every case it can express.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from prism.schemas import ContractViolation, parse_event
from tests.fixtures.events import DROP, event_bytes, make_event


@dataclass(frozen=True)
class Case:
    id: str
    event: dict[str, Any]
    error: str | None = None  # expected reason prefix (the field path); None = valid
    json_schema_rejects: bool = True  # False: a rule JSON Schema cannot express


def ok(id_: str, event: dict[str, Any]) -> Case:
    return Case(id_, event)


def bad(id_: str, event: dict[str, Any], path: str, *, expressible: bool = True) -> Case:
    return Case(id_, event, f"{path}:", expressible)


def env(type_: str = "agent_started", **envelope: Any) -> dict[str, Any]:
    return make_event(type_, envelope=envelope)


def usage(**fields: Any) -> dict[str, Any]:
    return make_event("usage_recorded", usage={"inputTokens": 10, **fields})


def closest(n: int) -> list[dict[str, Any]]:
    return [{"axis": f"a{i}", "used": i, "maximum": 10} for i in range(n)]


def error_message(msg: str) -> dict[str, Any]:
    return make_event("error", error={"code": "x", "message": msg})


CASES: list[Case] = [
    # envelope ids: 1..128 characters
    ok("event-id-128", env(eventId="e" * 128)),
    bad("event-id-empty", env(eventId=""), "eventId"),
    bad("event-id-129", env(eventId="e" * 129), "eventId"),
    ok("run-id-1", env(runId="r")),
    bad("run-id-empty", env(runId=""), "runId"),
    bad("run-id-number", env(runId=7), "runId"),
    # seq >= 0, an integer
    ok("seq-0", env(seq=0)),
    bad("seq-negative", env(seq=-1), "seq"),
    bad("seq-string", env(seq="3"), "seq"),
    bad("seq-fraction", env(seq=1.5), "seq"),
    # ts: RFC 3339 with seconds and an offset
    ok("ts-offset", env(ts="2025-01-31T12:00:00.123+02:00")),
    ok("ts-z", env(ts="2025-01-31T12:00:00Z")),
    bad("ts-naive", env(ts="2025-01-31T12:00:00"), "ts"),
    bad("ts-no-seconds", env(ts="2025-01-31T12:00Z"), "ts"),
    bad("ts-epoch-number", env(ts=1738324800), "ts"),
    bad("ts-date-only", env(ts="2025-01-31"), "ts"),
    # schema and data
    bad("schema-other-version", env(schema="prism.agent-event/v2"), "schema"),
    bad("schema-missing", env(schema=DROP), "schema"),
    ok("data-empty-object", env(data={})),
    bad("data-missing", env(data=DROP), "data"),
    bad("data-not-object", env(data=[]), "data"),
    # bundleDigest shape
    ok("digest", env(bundleDigest="sha256:" + "0f" * 32)),
    bad("digest-uppercase", env(bundleDigest="sha256:" + "0F" * 32), "bundleDigest"),
    bad("digest-short", env(bundleDigest="sha256:abc"), "bundleDigest"),
    bad("digest-md5", env(bundleDigest="md5:" + "0f" * 32), "bundleDigest"),
    # parent run id is a run id
    ok("parent", env(parent={"runId": "p1", "delegationId": "d1", "childId": "c1"})),
    bad("parent-empty-run-id", env(parent={"runId": "", "delegationId": "d1"}), "parent.runId"),
    # provider turn: stopReason enum, 1-based turn and attempt, non-negative numbers
    ok(
        "turn-stop-max-output", make_event("provider_turn_finished", stopReason="max_output_tokens")
    ),
    bad(
        "turn-stop-length",
        make_event("provider_turn_finished", stopReason="length"),
        "data.stopReason",
    ),
    bad("turn-0", make_event("provider_turn_finished", turn=0), "data.turn"),
    bad("attempt-0", make_event("provider_turn_finished", attempt=0), "data.attempt"),
    bad("turn-missing", make_event("provider_turn_finished", turn=DROP), "data.turn"),
    bad("latency-negative", make_event("provider_turn_finished", latencyMs=-1), "data.latencyMs"),
    bad(
        "budgets-negative",
        make_event(
            "provider_turn_finished", budgets={"runInputUsed": -5, "turns": 1, "maxTurns": 4}
        ),
        "data.budgets.runInputUsed",
    ),
    bad("tools-missing", make_event("provider_turn_finished", tools=DROP), "data.tools"),
    ok("hit-rate-1", make_event("provider_turn_finished", cache={"hitRate": 1})),
    bad(
        "hit-rate-above-1",
        make_event("provider_turn_finished", cache={"hitRate": 1.5}),
        "data.cache.hitRate",
    ),
    ok("turn-usage-absent", make_event("provider_turn_finished", usage=DROP, cache=DROP)),
    bad("tool-call-turn-0", make_event("tool_call_finished", turn=0), "data.turn"),
    bad("tool-call-ok-string", make_event("tool_call_finished", ok="yes"), "data.ok"),
    # agent_finished: stopReason enum, stopDetail <= 256 bytes of UTF-8
    ok("finish-turn-limit", make_event("agent_finished", stopReason="turn_limit")),
    bad("finish-end-turn", make_event("agent_finished", stopReason="end_turn"), "data.stopReason"),
    ok("stop-detail-256-ascii", make_event("agent_finished", stopDetail="x" * 256)),
    ok("stop-detail-256-bytes", make_event("agent_finished", stopDetail="é" * 128)),
    bad(
        "stop-detail-258-bytes",
        make_event("agent_finished", stopDetail="é" * 129),
        "data.stopDetail",
        expressible=False,
    ),
    bad(
        "stop-detail-257-ascii",
        make_event("agent_finished", stopDetail="x" * 257),
        "data.stopDetail",
    ),
    # deterministic turns: middleware id pattern
    ok("middleware", make_event("deterministic_turn_finished", middleware="faq.cache:v1-2_x")),
    ok("middleware-64", make_event("deterministic_turn_finished", middleware="m" * 64)),
    bad(
        "middleware-65",
        make_event("deterministic_turn_finished", middleware="m" * 65),
        "data.middleware",
    ),
    bad(
        "middleware-empty",
        make_event("deterministic_turn_finished", middleware=""),
        "data.middleware",
    ),
    bad(
        "middleware-slash",
        make_event("deterministic_turn_finished", middleware="a/b"),
        "data.middleware",
    ),
    # usage scopes
    ok("scope-turn", make_event("usage_recorded", scope="provider_turn", turn=2, attempt=1)),
    bad("scope-turn-no-turn", make_event("usage_recorded", turn=DROP), "data.turn"),
    bad("scope-turn-no-attempt", make_event("usage_recorded", attempt=DROP), "data.attempt"),
    ok("scope-total", make_event("usage_recorded", scope="run_total", turn=DROP, attempt=DROP)),
    bad(
        "scope-total-turn",
        make_event("usage_recorded", scope="run_total", attempt=DROP),
        "data.turn",
    ),
    bad(
        "scope-total-attempt",
        make_event("usage_recorded", scope="run_total", turn=DROP),
        "data.attempt",
    ),
    bad("scope-unknown", make_event("usage_recorded", scope="tenant"), "data.scope"),
    # estimates are never priced; confidence only on estimates
    ok("estimate", usage(estimated=True, confidence="low")),
    bad("estimate-cost", usage(estimated=True, cost="0.12"), "data.usage.cost"),
    bad("estimate-currency", usage(estimated=True, currency="USD"), "data.usage.currency"),
    ok("reported-priced", usage(estimated=False, cost="0.12", currency="USD")),
    bad("confidence-alone", usage(confidence="medium"), "data.usage.confidence"),
    bad("confidence-reported", usage(estimated=False, confidence="low"), "data.usage.confidence"),
    bad("confidence-high", usage(estimated=True, confidence="high"), "data.usage.confidence"),
    # token counts and cost non-negative; cost a decimal string or number
    ok("tokens-0", usage(inputTokens=0, outputTokens=0, cacheReadTokens=0)),
    bad("tokens-negative", usage(outputTokens=-1), "data.usage.outputTokens"),
    bad("cache-read-negative", usage(cacheReadTokens=-3), "data.usage.cacheReadTokens"),
    ok("cost-string", usage(cost="0.0125")),
    ok("cost-number", usage(cost=0.0125)),
    ok("cost-zero", usage(cost=0)),
    bad("cost-negative", usage(cost=-0.01), "data.usage.cost"),
    bad("cost-negative-string", usage(cost="-0.01"), "data.usage.cost"),
    bad("cost-exponent-string", usage(cost="1e-3"), "data.usage.cost"),
    bad("cost-padded-string", usage(cost=" 1"), "data.usage.cost"),
    bad("cost-bool", usage(cost=True), "data.usage.cost"),
    # currency ISO 4217 shape
    ok("currency", usage(currency="EUR")),
    bad("currency-lowercase", usage(currency="eur"), "data.usage.currency"),
    bad("currency-4", usage(currency="EURO"), "data.usage.currency"),
    bad("limit-currency", make_event("run_limit_exceeded", currency="$"), "data.currency"),
    # ErrorInfo: failureClass enum, message <= 1 KiB of UTF-8
    ok(
        "failure-class",
        make_event("error", error={"code": "x", "message": "m", "failureClass": "quota"}),
    ),
    bad(
        "failure-class-fatal",
        make_event("error", error={"code": "x", "message": "m", "failureClass": "fatal"}),
        "data.error.failureClass",
    ),
    ok("message-1024", error_message("m" * 1024)),
    ok("message-1024-bytes", error_message("é" * 512)),
    bad("message-1025", error_message("m" * 1025), "data.error.message"),
    bad("message-1026-bytes", error_message("é" * 513), "data.error.message", expressible=False),
    bad("error-missing", make_event("error", error=DROP), "data.error"),
    bad(
        "child-failed-message",
        make_event("child_failed", error={"code": "x", "message": "m" * 1025}),
        "data.error.message",
    ),
    # budget_exhausted list caps
    ok("closest-3", make_event("budget_exhausted", closest=closest(3))),
    bad("closest-4", make_event("budget_exhausted", closest=closest(4)), "data.closest"),
    ok("hashes-10", make_event("budget_exhausted", lastToolCallHashes=["h"] * 10)),
    bad(
        "hashes-11",
        make_event("budget_exhausted", lastToolCallHashes=["h"] * 11),
        "data.lastToolCallHashes",
    ),
    bad("counters-list", make_event("budget_exhausted", counters=[1]), "data.counters"),
    # other required payload fields
    bad("denied-no-reason", make_event("agent_denied", reason=DROP), "data.reason"),
    bad("capped-negative", make_event("delegation_child_events_capped", cap=-1), "data.cap"),
    bad("milestone-turn-0", make_event("child_milestone", turn=0), "data.turn"),
    bad(
        "clamped-dropped-string",
        make_event("tool_narrowing_clamped", dropped="shell"),
        "data.dropped",
    ),
    bad("limit-maximum-string", make_event("run_limit_exceeded", maximum="16"), "data.maximum"),
]


def case_id(case: Case) -> str:
    return case.id


def test_case_ids_are_unique() -> None:
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", [c for c in CASES if c.error is None], ids=case_id)
def test_valid_examples_parse(case: Case) -> None:
    ev = parse_event(event_bytes(case.event))
    assert ev.type == case.event["type"]
    assert ev.event_id == case.event["eventId"]


@pytest.mark.parametrize("case", [c for c in CASES if c.error is not None], ids=case_id)
def test_invalid_examples_are_contract_violations_naming_the_path(case: Case) -> None:
    with pytest.raises(ContractViolation) as caught:
        parse_event(event_bytes(case.event))
    assert caught.value.code == "contract_violation"
    assert case.error is not None
    assert caught.value.reason.startswith(case.error), caught.value.reason
    assert "\n" not in caught.value.reason
