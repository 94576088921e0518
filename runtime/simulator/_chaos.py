"""Delivery of a run's events as Kafka records, with the chaos the pipeline must survive.

Per run, in this order: post-terminal noise and conflicting terminals are emitted after
the real terminal; events are encoded; malformed and oversized records replace events
(never ``agent_started`` nor a terminal) or are added as corrupted copies; records up to
the terminal are shuffled within the reorder window; noise follows the terminal; finally
duplicates (identical, or the same ``(runId, seq)`` under a new ``eventId``) are re-sent
a few positions later.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import orjson

from ._builder import RunBuilder, hex_id

__all__ = [
    "FLAVOURS",
    "RECORD_KINDS",
    "FleetRecord",
    "RunChaos",
    "add_duplicates",
    "add_post_terminal",
    "deliver",
    "dumps",
    "eligible_for_replacement",
]

RECORD_KINDS = ("valid", "unparsable", "contract_violation", "oversized")
# malformed flavour -> record kind
FLAVOURS: dict[str, str] = {
    "truncated_json": "unparsable",
    "invalid_utf8": "unparsable",
    "not_an_object": "unparsable",
    "wrong_type": "contract_violation",
    "priced_estimate": "contract_violation",
}
_CONTENT_TYPE = ("content-type", b"application/json")


def dumps(obj: Any) -> bytes:
    """Compact JSON bytes, copied to an exact-size object (orjson's buffer is much larger
    than its content, which would multiply the memory a fleet holds)."""
    return memoryview(orjson.dumps(obj)).tobytes()


@dataclass(frozen=True, slots=True)
class FleetRecord:
    """One Kafka record as delivered: key, value, headers, plus what it is.

    ``family`` is ``agent`` (topic ``prism.agent-events``, key runId) or ``channel``
    (``prism.channel-operations``, key operationId, or connectionId for a denial).
    ``kind`` is ``valid``, ``unparsable``, ``contract_violation`` or ``oversized``;
    ``event`` is the envelope of a valid record (of an oversized one: before padding);
    ``ts_ms`` is when it was produced (a skewed producer stamps another ``ts``);
    ``note`` names the chaos that produced it (empty for an ordinary event; junk added
    next to the events it copies ends in `` (extra)``).
    """

    key: bytes
    value: bytes
    headers: tuple[tuple[str, bytes], ...]
    kind: str
    ts_ms: int
    event: dict[str, Any] | None = None
    note: str = ""
    family: str = "agent"


@dataclass(slots=True)
class RunChaos:
    """The chaos decided for one run."""

    malformed: list[tuple[str, str]] = field(default_factory=list)  # (flavour, replace|extra)
    oversized: bool = False
    post_terminal: int = 0
    conflicting: bool = False


def eligible_for_replacement(b: RunBuilder) -> list[int]:
    """Indexes of events chaos may replace: not agent_started, not terminal, not noise."""
    end = b.terminal_index if b.terminal_index is not None else len(b.events)
    return [i for i in range(1, end) if b.events[i][1]["type"] != "agent_started"]


def _is_estimate_row(ev: dict[str, Any]) -> bool:
    data = ev["data"]
    return ev["type"] == "usage_recorded" and bool(data.get("usage", {}).get("estimated"))


def add_post_terminal(b: RunBuilder, noise: int, conflicting: bool) -> None:
    """Emit non-terminal noise and/or a conflicting terminal after the run's terminal."""
    assert b.terminal_index is not None
    rng = b.rng
    terminal = b.events[b.terminal_index][1]
    turn = 1 + max((int(ev["data"].get("turn", 0)) for _, ev in b.events), default=0)
    for _ in range(noise):
        b.advance(100, 30_000)
        kind = rng.choice(
            ("usage_recorded", "tool_call_finished", "extension_error", "provider_turn_finished")
        )
        if kind == "usage_recorded":
            usage = {"inputTokens": rng.randint(500, 9_000), "outputTokens": rng.randint(10, 900)}
            usage["totalTokens"] = usage["inputTokens"] + usage["outputTokens"]
            b.emit(
                kind,
                {
                    "scope": "provider_turn",
                    "turn": turn,
                    "attempt": 1,
                    "usage": {**usage, "cost": "0.004200", "currency": "USD"},
                },
            )
        elif kind == "tool_call_finished":
            b.emit(
                kind,
                {
                    "turn": turn,
                    "tool": "kb.lookup",
                    "callIdHash": hex_id(rng),
                    "durationMs": rng.randint(10, 900),
                    "ok": True,
                },
            )
        elif kind == "extension_error":
            b.emit(kind, {"extension": "telemetry.flush", "code": "LATE_CALLBACK"})
        else:
            b.emit(
                kind,
                {
                    "turn": turn,
                    "attempt": 1,
                    "latencyMs": rng.randint(300, 4_000),
                    "stopReason": "end_turn",
                    "budgets": {"runInputUsed": 0, "turns": turn, "maxTurns": 32},
                    "tools": {"count": 0, "idsHash": "0" * 16},
                    "usage": {
                        "inputTokens": 1_000,
                        "outputTokens": 50,
                        "totalTokens": 1_050,
                        "cost": "0.000500",
                        "currency": "USD",
                    },
                },
            )
    if conflicting:
        b.advance(100, 30_000)
        if terminal["type"] == "agent_finished":
            b.emit(
                "error",
                {
                    "error": {
                        "code": "LATE_FAILURE",
                        "message": "worker lost lease",
                        "failureClass": "transient",
                    }
                },
            )
        else:
            b.emit("agent_finished", {"finishReason": "stop"})


def _encode(
    ev: dict[str, Any],
    ms: int,
    key: bytes,
    headers: tuple[tuple[str, bytes], ...],
    max_bytes: int,
    note: str = "",
) -> FleetRecord:
    value = dumps(ev)
    kind = "oversized" if len(value) > max_bytes else "valid"
    return FleetRecord(key, value, headers, kind, ms, ev, note)


def _junk(rng: random.Random, flavour: str, rec: FleetRecord, extra: bool = False) -> FleetRecord:
    ev = rec.event
    assert ev is not None
    if flavour == "truncated_json":
        value = rec.value[: rng.randint(1, len(rec.value) - 2)]
    elif flavour == "invalid_utf8":
        value = rec.value.replace(b'"eventId":"', b'"eventId":"\xff\xfe', 1)
    elif flavour == "not_an_object":
        value = b"[" + rec.value + b"]"
    elif flavour == "wrong_type":
        field_, bad = rng.choice((("seq", "three"), ("ts", "yesterday"), ("eventId", 12345)))
        value = dumps({**ev, field_: bad})
    else:  # priced_estimate: an estimate carrying a price is a contract violation
        data = ev["data"]
        priced = {**data["usage"], "cost": "0.003100", "currency": "USD"}
        value = dumps({**ev, "data": {**data, "usage": priced}})
    note = f"{flavour} (extra)" if extra else flavour
    return FleetRecord(rec.key, value, rec.headers, FLAVOURS[flavour], rec.ts_ms, None, note)


def _oversized(rng: random.Random, rec: FleetRecord, max_bytes: int) -> FleetRecord:
    assert rec.event is not None
    pad = max_bytes - len(rec.value) + rng.randint(1_024, 65_536)
    value = dumps({**rec.event, "debugPadding": "x" * pad})
    return FleetRecord(rec.key, value, rec.headers, "oversized", rec.ts_ms, rec.event, "oversized")


def deliver(
    b: RunBuilder, chaos: RunChaos, reorder_window: int, max_bytes: int
) -> list[FleetRecord]:
    """The run's records in delivery order (duplicates are added separately)."""
    rng = b.rng
    key = b.run_id.encode()
    trace = hex_id(rng, 16)
    recs = [
        _encode(
            ev,
            ms,
            key,
            (_CONTENT_TYPE, ("traceparent", f"00-{trace}-{hex_id(rng)}-01".encode())),
            max_bytes,
        )
        for ms, ev in b.events
    ]
    end = b.terminal_index + 1 if b.terminal_index is not None else len(recs)
    core, tail = recs[:end], recs[end:]
    for i, rec in enumerate(tail):
        if rec.event is not None and rec.kind == "valid":
            note = (
                "conflicting_terminal"
                if rec.event["type"] in ("agent_finished", "error", "agent_denied")
                else "post_terminal"
            )
            tail[i] = FleetRecord(
                rec.key, rec.value, rec.headers, rec.kind, rec.ts_ms, rec.event, note
            )
    eligible = eligible_for_replacement(b)
    extras: list[FleetRecord] = []
    # A priced estimate needs an estimate row to corrupt: it picks first.
    for flavour, mode in sorted(chaos.malformed, key=lambda fm: fm[0] != "priced_estimate"):
        pool = [i for i in eligible if core[i].kind == "valid"]
        if flavour == "priced_estimate":
            pool = [i for i in pool if _is_estimate_row(core[i].event or {})]
            flavour = flavour if pool else "wrong_type"
        if mode == "replace" and pool:
            i = rng.choice(pool)
            core[i] = _junk(rng, flavour, core[i])
        else:
            sources = pool or [i for i in range(len(core)) if core[i].kind == "valid"]
            extras.append(_junk(rng, flavour, core[rng.choice(sources)], extra=True))
    if chaos.oversized:
        pool = [i for i in eligible if core[i].kind == "valid"]
        if pool:
            i = rng.choice(pool)
            core[i] = _oversized(rng, core[i], max_bytes)
    for junk in extras:
        core.insert(rng.randint(1, len(core)), junk)
    if reorder_window > 0 and len(core) > 1:
        keyed = sorted((i + rng.uniform(0, reorder_window), i) for i in range(len(core)))
        core = [core[i] for _, i in keyed]
    return core + tail


def add_duplicates(
    rng: random.Random,
    recs: list[FleetRecord],
    p: float,
    terminal_seq: int | None,
    force: bool = False,
) -> int:
    """Re-send records a few positions later; return how many copies were added.

    A quarter of the copies (when the event precedes the terminal) are re-emissions: same
    ``(runId, seq)`` and content, new ``eventId``. ``force`` adds one of each kind.
    """
    inserts: list[tuple[int, FleetRecord]] = []
    candidates = [i for i, r in enumerate(recs) if r.kind == "valid" and r.event is not None]
    pre = [i for i in candidates if _before_terminal(recs[i], terminal_seq)]
    chosen = [(i, rng.random() < 0.25) for i in candidates if rng.random() < p]
    if force and candidates:
        chosen.append((rng.choice(candidates), False))
        if pre:
            chosen.append((rng.choice(pre), True))
    for i, reemit in chosen:
        rec = recs[i]
        ev = rec.event
        assert ev is not None
        if reemit and _before_terminal(rec, terminal_seq):
            new_ev = {**ev, "eventId": _new_event_id(rng, ev["eventId"])}
            copy = FleetRecord(
                rec.key,
                dumps(new_ev),
                rec.headers,
                "valid",
                rec.ts_ms,
                new_ev,
                "re-emission",
            )
        else:
            copy = FleetRecord(
                rec.key, rec.value, rec.headers, rec.kind, rec.ts_ms, ev, "duplicate"
            )
        inserts.append((i + rng.randint(1, 6), copy))
    for pos, copy in sorted(inserts, key=lambda x: x[0], reverse=True):
        recs.insert(min(pos, len(recs)), copy)
    return len(inserts)


def _before_terminal(rec: FleetRecord, terminal_seq: int | None) -> bool:
    ev = rec.event
    if ev is None or ev["type"] in ("agent_finished", "agent_denied", "error"):
        return False
    return terminal_seq is None or int(ev["seq"]) < terminal_seq


def _new_event_id(rng: random.Random, old: str) -> str:
    # Keep the time prefix (ids stay time-ordered), change the random tail.
    return old[:24] + hex_id(rng, 6)
