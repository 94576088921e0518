"""Redaction: dead-letter previews and unknown-type data keep no content or secret."""

from __future__ import annotations

import hashlib

import orjson
import pytest

from prism.pipeline.ingest import ingest_lines
from prism.schemas import (
    DEFAULT_DENY,
    DeadLetterRow,
    dead_letter_preview,
    deny_list,
    is_denied_key,
    mask_secrets,
    redact_unknown_data,
)

# name -> (text, the part that must not survive)
SECRETS = {
    "bearer": ("Bearer abcdefghijklmnop0123456789", "abcdefghijklmnop"),
    "jwt": (
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.c2lnbmF0dXJlMTIz",
        "c2lnbmF0dXJlMTIz",
    ),
    "openai": ("sk-proj-0123456789abcdefABCDEF", "0123456789abcdef"),
    "aws": ("AKIAABCDEFGHIJKLMNOP", "ABCDEFGHIJKLMNOP"),
    "github": ("ghp_0123456789abcdefghijABCDEFGHIJ", "abcdefghij"),
    "url": ("https://alice:hunter2-secret@db.example.com/prism", "hunter2"),
    "query": ("https://hooks.example.com/x?token=tok-very-secret-123&a=1", "very-secret"),
}


@pytest.mark.parametrize(
    ("key", "denied"),
    [
        ("args", True),
        ("arguments", True),
        ("prompt", True),
        ("messages", True),
        ("content", True),
        ("result", True),
        ("text", True),
        ("input", True),
        ("output", True),
        ("apiKey", True),
        ("API_KEY", True),
        ("x-api-key", True),
        ("Authorization", True),
        ("accessToken", True),
        ("refresh_token", True),
        ("token", True),
        ("clientSecret", True),
        ("db_password", True),
        # Counts and ids that merely mention a word are kept.
        ("inputTokens", False),
        ("cacheReadTokens", False),
        ("maxTokens", False),
        ("tool", False),
        ("runId", False),
        ("inputs_count", False),
    ],
)
def test_deny_list_matches_keys_in_any_style(key: str, denied: bool) -> None:
    assert is_denied_key(key) is denied


def test_unknown_data_loses_denied_keys_at_every_depth() -> None:
    data = {
        "step": 3,
        "tool": "search",
        "args": {"q": "the user's question"},
        "result": "42 documents",
        "nested": {"apiKey": "k-1", "ok": True, "list": [{"prompt": "p"}, {"n": 1}]},
        "inputTokens": 120,
        "note": f"called with {SECRETS['bearer'][0]}",
    }
    out = redact_unknown_data(data)
    assert out == {
        "step": 3,
        "tool": "search",
        "nested": {"ok": True, "list": [{}, {"n": 1}]},
        "inputTokens": 120,
        "note": "called with Bearer ***",
    }
    assert data["args"] == {"q": "the user's question"}, "the input is not modified"


def test_unknown_data_deny_list_is_configurable() -> None:
    data = {"args": 1, "tenant_note": "x", "step": 2}
    assert redact_unknown_data(data, frozenset({"tenant_*"})) == {"args": 1, "step": 2}
    assert redact_unknown_data(data, deny_list("+tenant_*")) == {"step": 2}


def test_deny_list_text_replaces_or_extends_the_default() -> None:
    assert deny_list("") == DEFAULT_DENY
    assert deny_list("a, b") == frozenset({"a", "b"})
    assert deny_list("+a") == DEFAULT_DENY | {"a"}
    with pytest.raises(ValueError, match="'a b'"):
        deny_list("a b,c")


@pytest.mark.parametrize("name", list(SECRETS))
def test_secret_looking_strings_are_masked(name: str) -> None:
    secret, sensitive = SECRETS[name]
    masked = mask_secrets(f"see {secret} here")
    assert sensitive not in masked and "***" in masked, masked
    assert masked.startswith("see ") and masked.endswith(" here")


def test_url_password_with_at_sign_and_slash_is_masked_whole() -> None:
    masked = mask_secrets("dsn https://prism:S3c@r/et@ch.example:8443/prism ok")
    assert masked == "dsn https://prism:***@ch.example:8443/prism ok"


def test_json_dead_letter_keeps_structure_and_masks_content() -> None:
    raw = orjson.dumps(
        {
            "eventId": "e1",
            "runId": "r1",
            "type": "tool_call_finished",
            "data": {"tool": "search", "args": {"q": "secret question"}, "result": "answer"},
            "auth": SECRETS["bearer"][0],
        }
    )
    kept = dead_letter_preview(raw)
    assert (kept.size, kept.sha256) == (len(raw), hashlib.sha256(raw).hexdigest())
    assert kept.preview == (
        '{"eventId":"e1","runId":"r1","type":"tool_call_finished",'
        '"data":{"tool":"search","args":"***","result":"***"},"auth":"Bearer ***"}'
    )


def test_preview_is_bounded_and_says_it_was_cut() -> None:
    raw = orjson.dumps({"runId": "r" * 5000})
    kept = dead_letter_preview(raw, max_preview=64)
    assert len(kept.preview) == 64 and kept.preview.endswith("…")
    assert kept.size == len(raw)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        # Truncated JSON: a denied string value is masked up to where it ends (or the text).
        (b'{"runId": "r1", "prompt": "tell me the pass', '{"runId": "r1", "prompt": "***"'),
        (
            b'{"runId": "r1", "prompt": "a \\" b", "seq": 1',
            '{"runId": "r1", "prompt": "***", "seq": 1',
        ),
        # A denied object or array: the preview stops there.
        (b'{"runId": "r1", "args": {"q": "x"}, "seq": 1,', '{"runId": "r1", "args": *** …'),
        (b'{"password": 12345, "seq": 1,', '{"password": ***, "seq": 1,'),
        # Not JSON at all: secret-looking text is masked, control bytes escaped.
        (b"\xffAuthorization: Bearer abcdefghijklmnop\x00", "\\xffAuthorization: Bearer ***\\x00"),
        (b"GET /hook?token=abcdef123&x=1", "GET /hook?token=***&x=1"),
    ],
)
def test_broken_dead_letters_are_masked_as_text(raw: bytes, expected: str) -> None:
    assert dead_letter_preview(raw).preview == expected


def test_oversized_dead_letters_are_hashed_whole_and_previewed_from_the_start() -> None:
    raw = b'{"runId": "r1", "content": "' + b"x" * 3_000_000 + b'"}'
    kept = dead_letter_preview(raw)
    assert kept.size == len(raw) and kept.sha256 == hashlib.sha256(raw).hexdigest()
    assert kept.preview == '{"runId": "r1", "content": "***"'


def test_ingest_stores_the_preview_not_the_bytes() -> None:
    line = orjson.dumps({"runId": "r1", "type": "x", "data": {"prompt": "private words"}})
    dead: list[DeadLetterRow] = []
    key = SECRETS["openai"][0]
    ingest_lines(
        [b"not json " + key.encode(), line],
        source="f",
        store=lambda out: dead.extend(out.ledger.dead_letters),
    )
    first, second = dead
    assert (first.offset, first.code, first.size) == (1, "unparsable", 9 + len(key))
    assert first.preview == "not json ***"
    assert second.code == "contract_violation"
    assert second.sha256 == hashlib.sha256(line).hexdigest()
    assert "private words" not in second.preview and '"prompt":"***"' in second.preview
    assert not hasattr(second, "raw")


def test_prose_is_left_alone() -> None:
    text = "token limitation exceeded after 3 turns; see https://docs.example.com/limits?x=1"
    assert mask_secrets(text) == text
