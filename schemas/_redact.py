"""Redaction of what the ledger keeps outside the contract: dead-letter previews, unknown data.

The contract says secrets, prompts, tool arguments and tool results never appear in events,
but a producer can send them by mistake. Two helpers keep them out of the ledger:

- ``dead_letter_preview(raw)``: the size and SHA-256 of a dead letter's bytes and a bounded
  preview in which deny-listed JSON values and secret-looking strings are masked (the full
  bytes stay on the DLQ topic);
- ``redact_unknown_data(data)``: an unknown event type's ``data`` without the keys on the
  deny-list (recursively), secret-looking strings masked.

A deny-list entry is a key name or a glob (``*secret*``), compared with the key in
snake_case and lower case, so ``apiKey``, ``API_KEY`` and ``x-api-key`` all meet
``*api_key*``. Token *counts* (``inputTokens``) are not secrets: the default list names
``token``, ``*_token`` and ``token_*`` rather than ``*token*``.

Example::

    >>> redact_unknown_data({"tool": "search", "args": {"q": "x"}, "apiKey": "k"})
    {'tool': 'search'}
    >>> dead_letter_preview(b'{"prompt": "hello"}').preview
    '{"prompt":"***"}'
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import orjson

__all__ = [
    "DEFAULT_DENY",
    "MASK",
    "DeadLetterPreview",
    "dead_letter_preview",
    "deny_list",
    "is_denied_key",
    "mask_secrets",
    "redact_unknown_data",
]

MASK = "***"

# Content keys (what a tool or a model saw or said) and secret-looking keys.
DEFAULT_DENY: frozenset[str] = frozenset(
    {
        "args",
        "arguments",
        "prompt",
        "prompts",
        "messages",
        "content",
        "result",
        "text",
        "input",
        "output",
        "token",
        "*_token",
        "token_*",
        "*_token_*",
        "*secret*",
        "*password*",
        "*passwd*",
        "authorization",
        "*api_key*",
        "*apikey*",
        "*access_key*",
        "*private_key*",
        "*credential*",
        "cookie",
        "set_cookie",
    }
)

# Values that look like credentials wherever they appear.
_SECRET_VALUE_RES: tuple[tuple[re.Pattern[str], str], ...] = (
    # user:password@ in any URL: keep the user, mask the password.
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s/:@\"']*:)[^\s\"']+@"), r"\1" + MASK + "@"),
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}"), r"\1 " + MASK),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*"), MASK),  # JWT
    (re.compile(r"\b(?:sk|pk|rk)-[A-Za-z0-9_-]{16,}"), MASK),  # API keys (sk-..., sk-ant-...)
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), MASK),  # AWS access key ids
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"), MASK),  # GitHub tokens
    (re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"), MASK),  # Slack tokens
    (
        re.compile(
            r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)"
        ),
        MASK,
    ),
    # key=value pairs in query strings and headers.
    (
        re.compile(
            r"(?i)\b((?:access_|refresh_|id_|api_|auth_)?token|secret|password|passwd|"
            r"api[_-]?key|signature|sig)=[^&\s\"']+"
        ),
        r"\1=" + MASK,
    ),
)
_CAMEL_RE = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_JSON_KEY_RE = re.compile(r'"((?:[^"\\]|\\.){1,200})"\s*:\s*')
_JSON_STRING_RE = re.compile(r'"(?:[^"\\]|\\.)*(?:"|$)')
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
MAX_PARSE_BYTES = 1_048_576  # larger dead letters are previewed as text, not parsed


@dataclass(frozen=True, slots=True)
class DeadLetterPreview:
    """What the ledger keeps of a dead letter: its size, SHA-256 (hex) and a redacted preview."""

    size: int
    sha256: str
    preview: str


def _normalise(key: str) -> str:
    return _CAMEL_RE.sub("_", key).lower().replace("-", "_").replace(" ", "_")


@lru_cache(maxsize=64)
def _compiled(deny: frozenset[str]) -> tuple[frozenset[str], tuple[str, ...]]:
    names = {_normalise(d) for d in deny}
    exact = frozenset(n for n in names if not any(c in n for c in "*?["))
    return exact, tuple(sorted(names - exact))


def is_denied_key(key: str, deny: frozenset[str] = DEFAULT_DENY) -> bool:
    """Whether ``key`` (any case or style) is on ``deny`` (names and globs)."""
    exact, globs = _compiled(deny)
    name = _normalise(key)
    return name in exact or any(fnmatch.fnmatchcase(name, g) for g in globs)


def deny_list(text: str, default: Iterable[str] = DEFAULT_DENY) -> frozenset[str]:
    """A deny-list from comma-separated text (``PRISM_REDACT_KEYS``).

    ``a,b`` replaces the default list; ``+a,b`` adds to it; an empty text keeps the default.
    Each entry is a key name or a glob (``*secret*``).
    """
    text = text.strip()
    extend = text.startswith("+")
    entries = [e.strip() for e in text.lstrip("+").split(",") if e.strip()]
    bad = [e for e in entries if not re.fullmatch(r"[A-Za-z0-9_*?.\-\[\]]{1,100}", e)]
    if bad:
        raise ValueError(
            f"deny-list entries {bad!r} are not key names or globs "
            "(letters, digits, _ - . and * ? [ ], at most 100 chars each)"
        )
    if not entries:
        return frozenset(default)
    return frozenset(entries) | (frozenset(default) if extend else frozenset())


def mask_secrets(text: str) -> str:
    """``text`` with secret-looking substrings (tokens, keys, URL passwords) replaced by ***."""
    for pattern, replacement in _SECRET_VALUE_RES:
        text = pattern.sub(replacement, text)
    return text


def redact_unknown_data(
    data: dict[str, Any], deny: frozenset[str] = DEFAULT_DENY
) -> dict[str, Any]:
    """``data`` without the keys on ``deny`` (at any depth), secret-looking strings masked.

    Example::

        redact_unknown_data({"step": 3, "result": "...", "meta": {"api_key": "k"}})
        # {"step": 3, "meta": {}}
    """
    out = _redact(data, deny, drop=True)
    assert isinstance(out, dict)
    return out


def _redact(value: Any, deny: frozenset[str], *, drop: bool) -> Any:
    """Drop (or, with ``drop=False``, mask) deny-listed keys; mask secret-looking strings."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if is_denied_key(str(key), deny):
                if not drop:
                    out[key] = MASK
                continue
            out[key] = _redact(item, deny, drop=drop)
        return out
    if isinstance(value, list):
        return [_redact(item, deny, drop=drop) for item in value]
    if isinstance(value, str):
        return mask_secrets(value)
    return value


def dead_letter_preview(
    raw: bytes, *, max_preview: int = 256, deny: frozenset[str] = DEFAULT_DENY
) -> DeadLetterPreview:
    """Size, SHA-256 and a preview of at most ``max_preview`` characters of a dead letter.

    JSON is previewed compactly with deny-listed values replaced by ``***``; anything else
    (bad JSON, truncated, binary) as text with the same masking done on the text: a
    deny-listed key's string value is masked, and the preview stops at a deny-listed key
    whose value is an object or an array. Control characters are escaped.

    Example::

        p = dead_letter_preview(b'{"runId": "r1", "args": {"q": "x"}}')
        p.size, p.sha256[:8], p.preview     # 35, '...', '{"runId":"r1","args":"***"}'
    """
    if max_preview < 16:
        raise ValueError(f"max_preview={max_preview} is too small to say anything; use >= 16")
    raw = bytes(raw)
    digest = hashlib.sha256(raw).hexdigest()
    text = None
    if len(raw) <= MAX_PARSE_BYTES:
        try:
            parsed = orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
        else:
            text = orjson.dumps(_redact(parsed, deny, drop=False)).decode()
    if text is None:
        window = raw[: max(16 * max_preview, 4096)].decode("utf-8", errors="backslashreplace")
        text = _mask_json_text(mask_secrets(window), deny)
    text = _CONTROL_RE.sub(lambda m: f"\\x{ord(m.group(0)):02x}", text)
    if len(text) > max_preview:
        text = text[: max_preview - 1] + "…"
    return DeadLetterPreview(size=len(raw), sha256=digest, preview=text)


def _mask_json_text(text: str, deny: frozenset[str]) -> str:
    """Mask deny-listed values in text that looks like (broken or truncated) JSON."""
    out: list[str] = []
    pos = 0
    for match in _JSON_KEY_RE.finditer(text):
        if match.start() < pos or not is_denied_key(match.group(1), deny):
            continue
        value_at = match.end()
        out.append(text[pos:value_at])
        if text.startswith('"', value_at):
            string = _JSON_STRING_RE.match(text, value_at)
            out.append(f'"{MASK}"')
            pos = string.end() if string else len(text)
        elif text[value_at : value_at + 1] in ("{", "["):
            out.append(MASK + " …")  # cannot tell where a nested value ends: stop here
            return "".join(out)
        else:
            end = re.compile(r"[,}\]\n]").search(text, value_at)
            out.append(MASK)
            pos = end.start() if end else len(text)
    out.append(text[pos:])
    return "".join(out)
