"""The spool's on-disk record format: a segment is ``MAGIC`` then framed records.

Each record is ``length u32 | crc32 u32 | seq u64 | payload`` (big-endian, the CRC over
``seq`` and ``payload``); the payload is the Kafka record: ``key_len u16 | key |
header_count u16 | (name_len u16 | name | value_len u32 | value)* | value``.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

from ._base import Record

__all__ = [
    "FRAME",
    "MAGIC",
    "MAX_PAYLOAD",
    "SEQ",
    "Segment",
    "check",
    "decode_record",
    "encode_record",
    "frame",
]

MAGIC = b"PRSPOOL1"
FRAME = struct.Struct(">IIQ")  # payload length, crc32(seq + payload), seq
SEQ = struct.Struct(">Q")
MAX_PAYLOAD = 64 * 2**20  # a larger length field is damage, not a record


_TOPIC_HEADER = "\x00topic"  # carries Record.topic through the spool; never sent as a header


def encode_record(record: Record) -> bytes:
    """The payload bytes of one record (see the module docstring)."""
    headers = list(record.headers)
    if record.topic is not None:
        headers.append((_TOPIC_HEADER, record.topic.encode()))
    parts = [struct.pack(">H", len(record.key)), record.key, struct.pack(">H", len(headers))]
    for name, value in headers:
        raw = name.encode()
        parts += [struct.pack(">H", len(raw)), raw, struct.pack(">I", len(value)), value]
    parts.append(record.value)
    return b"".join(parts)


def decode_record(payload: bytes) -> Record:
    """The record of ``encode_record``; raises ``ValueError`` on bytes that do not parse."""
    try:
        (klen,) = struct.unpack_from(">H", payload, 0)
        pos = 2 + klen
        key = payload[2:pos]
        (count,) = struct.unpack_from(">H", payload, pos)
        pos += 2
        headers = []
        for _ in range(count):
            (nlen,) = struct.unpack_from(">H", payload, pos)
            name = payload[pos + 2 : pos + 2 + nlen].decode()
            pos += 2 + nlen
            (vlen,) = struct.unpack_from(">I", payload, pos)
            headers.append((name, payload[pos + 4 : pos + 4 + vlen]))
            pos += 4 + vlen
    except (struct.error, UnicodeDecodeError) as exc:
        raise ValueError(f"spool record payload does not parse: {exc}") from None
    if pos > len(payload) or len(key) != klen:
        raise ValueError("spool record payload is shorter than its fields say")
    topic = next((v.decode() for n, v in headers if n == _TOPIC_HEADER), None)
    kept = tuple((n, v) for n, v in headers if n != _TOPIC_HEADER)
    return Record(key, payload[pos:], kept, topic)


def frame(seq: int, payload: bytes) -> bytes:
    """One framed record: length, CRC, seq, then the payload."""
    seq_bytes = SEQ.pack(seq)
    crc = zlib.crc32(payload, zlib.crc32(seq_bytes))
    return FRAME.pack(len(payload), crc, seq) + payload


@dataclass(slots=True)
class Segment:
    """One segment file as the spool knows it."""

    path: Path
    first_seq: int
    last_seq: int = -1  # -1: no readable record
    readable: int = len(MAGIC)  # bytes that hold whole, checked records
    size: int = 0  # bytes on disk (what counts against max_bytes)
    records: int = 0
    live: int = 0  # records at or above the ack watermark when the spool was opened


def check(data: bytes, pos: int) -> str:
    """Why the record at ``pos`` is not whole and intact ("" when it is)."""
    if pos + FRAME.size > len(data):
        return f"a torn record header ({len(data) - pos} of {FRAME.size} bytes)"
    length, crc, seq = FRAME.unpack_from(data, pos)
    if length > MAX_PAYLOAD:
        return f"an impossible record length {length}"
    end = pos + FRAME.size + length
    if end > len(data):
        return f"a torn record (seq {seq}, {len(data) - pos - FRAME.size} of {length} bytes)"
    if zlib.crc32(data[pos + FRAME.size : end], zlib.crc32(SEQ.pack(seq))) != crc:
        return f"a record failing its CRC (seq {seq})"
    return ""
