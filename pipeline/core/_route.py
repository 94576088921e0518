"""Where a record belongs: the partition Kafka's Java client gives its routing key.

The contract keys a run's records by ``runId`` (a channel operation's by ``operationId``),
so the default Kafka partitioner puts them on one partition, the run's *home*
(schemas/CONTRACT.md, "Transport"). ``home_partition`` is that partitioner: murmur2 of the
key bytes, made positive, modulo the partition count, exactly as
``org.apache.kafka.common.utils.Utils.murmur2`` and ``BuiltInPartitioner.partitionForKey``
compute it (the Java client, aiokafka and our publisher agree on it).

A record found elsewhere was produced by a client that keys or hashes otherwise;
``producer_pattern`` names the usual suspects so the worker can say which producer to fix:
a null key (sticky or random placement), a key that is not the routing key (an
``eventId``, say), librdkafka's default ``consistent_random`` partitioner (CRC-32 of the
key, unsigned, modulo the count) or Sarama's default hash partitioner (FNV-1a 32-bit, read
as a signed 32-bit integer, Go's truncated remainder, then its absolute value).
"""

from __future__ import annotations

import zlib
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Final, Protocol

from prism.schemas import ChannelOperation, FastEvent

from ._run import to_us
from ._types import Forward

if TYPE_CHECKING:  # only annotations name it: the module runs without mypy_extensions
    from mypy_extensions import i64

__all__ = [
    "CRC32_PATTERN",
    "FNV1A_PATTERN",
    "NULL_KEY",
    "OTHER_KEY",
    "PRODUCER_PATTERNS",
    "UNKNOWN_PATTERN",
    "crc32_partition",
    "fnv1a_32",
    "forward_of",
    "home_partition",
    "murmur2",
    "producer_pattern",
    "sarama_partition",
]

NULL_KEY = "null key"
OTHER_KEY = "key is not the runId (e.g. eventId)"
CRC32_PATTERN = "librdkafka default partitioner (CRC32)"
FNV1A_PATTERN = "Sarama default partitioner (FNV-1a)"
UNKNOWN_PATTERN = "unknown partitioner"
PRODUCER_PATTERNS = (NULL_KEY, OTHER_KEY, CRC32_PATTERN, FNV1A_PATTERN, UNKNOWN_PATTERN)
"""Every name ``producer_pattern`` gives (for a record keyed by ``runId``)."""

_M32: Final = 0xFFFFFFFF
_MURMUR_M: Final = 0x5BD1E995
_MURMUR_SEED: Final = 0x9747B28C


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2``: MurmurHash2 (seed 0x9747b28c) as a signed 32-bit int.

    Its integers are ``i64``: compiled (``make compile``), machine integers, where mypyc's
    ``int`` multiplies through a generic call (about 3 us a run id, against 0.15). Every
    product stays below 2**63: a value below 2**32 times ``_MURMUR_M``, below 2**31."""
    m: i64 = _MURMUR_M
    mask: i64 = _M32
    length: i64 = len(data)
    h: i64 = (_MURMUR_SEED ^ length) & mask
    whole: i64 = length & ~3
    i: i64 = 0
    while i < whole:
        k: i64 = data[i] | data[i + 1] << 8 | data[i + 2] << 16 | data[i + 3] << 24
        k = k * m & mask
        k = (k ^ k >> 24) * m & mask
        h = (h * m & mask) ^ k
        i += 4
    tail: i64 = length & 3
    if tail == 3:
        h ^= data[whole + 2] << 16
    if tail >= 2:
        h ^= data[whole + 1] << 8
    if tail:
        h = (h ^ data[whole]) * m & mask
    h = (h ^ h >> 13) * m & mask
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def home_partition(key: bytes, partitions: int) -> int:
    """The partition the Java client's default partitioner gives ``key``: ``toPositive(
    murmur2(key)) % partitions`` (the sign bit dropped, not the absolute value)."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def crc32_partition(key: bytes, partitions: int) -> int:
    """librdkafka's ``consistent`` / ``consistent_random`` partition of a non-empty key."""
    return zlib.crc32(key) % partitions


def fnv1a_32(data: bytes) -> int:
    """FNV-1a, 32 bits (Go's ``hash/fnv.New32a``), unsigned."""
    h = 0x811C9DC5
    for byte in data:
        h = (h ^ byte) * 0x01000193 & _M32
    return h


def sarama_partition(key: bytes, partitions: int) -> int:
    """Sarama's default ``NewHashPartitioner``: ``int32(fnv1a) % n``, negated when negative.

    Go's remainder truncates toward zero, so this is the absolute value of the signed hash
    modulo ``n`` (not Java's ``toPositive``: Sarama's ``NewReferenceHashPartitioner`` is).
    """
    h = fnv1a_32(key)
    signed = h - (1 << 32) if h & 0x80000000 else h
    return abs(signed) % partitions


def producer_pattern(
    record_key: bytes | None,
    routing_key: bytes,
    partition: int,
    partitions: int,
    *,
    field: str = "runId",
) -> str:
    """Why a record keyed ``record_key`` sits on ``partition`` rather than its routing key's
    home: the first of these that explains it (``PRODUCER_PATTERNS``).

    ``field`` names the routing key in the answer when it is not a ``runId`` (a channel
    operation's ``operationId``). Meant for records off their home; one at home is reported
    as an ``unknown partitioner``, as a custom partitioner that happened to agree would be.

    Example::

        producer_pattern(b"evt-1", b"run-1", 2, 4)   # "key is not the runId (e.g. eventId)"
    """
    if not record_key:
        return NULL_KEY  # librdkafka treats an empty key as none: random placement
    if record_key != routing_key:
        return OTHER_KEY if field == "runId" else OTHER_KEY.replace("runId", field)
    if crc32_partition(record_key, partitions) == partition:
        return CRC32_PATTERN
    if sarama_partition(record_key, partitions) == partition:
        return FNV1A_PATTERN
    return UNKNOWN_PATTERN


class _Record(Protocol):
    """What ``forward_of`` reads of an ``InRecord``."""

    value: bytes | None
    source: str
    partition: int
    offset: int
    key: bytes | None
    traceparent: str | None


# a run's records share its key: hashing each once keeps routing off the step's profile
_home = lru_cache(maxsize=1 << 16)(home_partition)


def forward_of(
    rec: _Record, item: Any, partitions: int | None, channel_partitions: int | None
) -> Forward | None:
    """The ``Forward`` of a parsed record found off its home partition (None: at home, a
    file line, or a family not routed). ``item``: what the record parsed to, an agent event
    (routed by ``runId`` on ``partitions``) or a ``ChannelOperation`` (by ``operationId``,
    or ``connectionId`` for a denial, which has none, on ``channel_partitions``)."""
    if isinstance(item, ChannelOperation):
        count, channel = channel_partitions, True
        if item.operation_id is not None:
            key, field = item.operation_id, "operationId"
        else:  # its producer keys a denial by connection (schemas/CONTRACT.md)
            key, field = item.connection_id, "connectionId"
    else:
        count, channel, key, field = partitions, False, item.run_id, "runId"
    if count is None or rec.partition < 0:
        return None
    routing_key = key.encode()
    home = _home(routing_key, count)
    if home == rec.partition:
        return None
    headers = [
        ("source-topic", rec.source.encode()),
        ("source-partition", str(rec.partition).encode()),
        ("source-offset", str(rec.offset).encode()),
    ]
    if rec.traceparent is not None:
        headers.append(("traceparent", rec.traceparent.encode()))
    return Forward(
        partition=home,
        channel=channel,
        key=routing_key,
        value=rec.value or b"",
        headers=tuple(headers),
        source=(rec.source, rec.partition, rec.offset),
        pattern=producer_pattern(rec.key, routing_key, rec.partition, count, field=field),
        ts_us=item.ts_us if isinstance(item, FastEvent) else to_us(item.ts),
    )
