"""The partitioners the core routes by and names producers by (pipeline/core/_route.py).

The vectors are fixed here, computed by the clients themselves on this machine:

- ``JAVA``: kafka-clients 4.4.0 (devstack/kafka/lib), ``Utils.murmur2(key)`` and
  ``BuiltInPartitioner.partitionForKey(key, n)`` for n = 4, 12, 7;
- ``SARAMA``: Go 1.x ``hash/fnv.New32a`` with Sarama's ``hashPartitioner.Partition``
  arithmetic (IBM/sarama partitioner.go, ``referenceAbs`` false: ``int32(sum) % n``,
  negated when negative) for n = 4, 12, 7;
- CRC-32: the standard check value (librdkafka's ``rd_crc32`` is CRC-32/ISO-HDLC, as zlib).

Keys cover every murmur2 tail length (0..3 bytes past a multiple of 4), multi-byte UTF-8
and hashes with the sign bit set, where ``toPositive`` and ``abs`` differ.
"""

from __future__ import annotations

import zlib

from hypothesis import given
from hypothesis import strategies as st

from prism.pipeline.core import PRODUCER_PATTERNS, home_partition, murmur2, producer_pattern
from prism.pipeline.core._route import (
    CRC32_PATTERN,
    FNV1A_PATTERN,
    NULL_KEY,
    OTHER_KEY,
    UNKNOWN_PATTERN,
    crc32_partition,
    fnv1a_32,
    sarama_partition,
)

RUN = "0197a3c8-aaaa-7bbb-8ccc-1234567890ab"
# key -> (murmur2, partition for 4, 12, 7 partitions), from the Java client
JAVA = {
    "": (275646681, 1, 9, 2),
    "a": (-1563381124, 0, 4, 5),
    "ab": (316155434, 2, 2, 0),
    "abc": (479470107, 3, 3, 4),
    "abcd": (-1323649548, 0, 8, 5),
    "abcde": (461995741, 1, 1, 4),
    "run-1": (637533037, 1, 1, 1),
    "run-42": (1115905536, 0, 0, 4),
    RUN: (1957846052, 0, 8, 1),
    "op-7f3e": (-1250773146, 2, 2, 2),
    "telegram:chat-991": (-777871092, 0, 8, 4),
    "r\u00e9sum\u00e9-\u2603": (-914695691, 1, 9, 2),
    "21": (-973932308, 0, 0, 3),  # Kafka's own UtilsTest.testMurmur2 vectors
    "foobar": (-790332482, 2, 6, 0),
}
# key -> (FNV-1a 32, Sarama's partition for 4, 12, 7 partitions), from Go
SARAMA = {
    "": (2166136261, 3, 3, 2),
    "a": (3826002220, 0, 0, 6),
    "ab": (1294271946, 2, 6, 2),
    "abc": (440920331, 3, 11, 5),
    "abcd": (3459545533, 3, 3, 1),
    "abcde": (1956368136, 0, 0, 2),
    "run-1": (1016944636, 0, 4, 1),
    "run-42": (598366947, 3, 3, 3),
    RUN: (1456107075, 3, 3, 3),
    "op-7f3e": (1659736212, 0, 0, 1),
    "telegram:chat-991": (1944046362, 2, 6, 6),
    "r\u00e9sum\u00e9-\u2603": (3322474166, 2, 2, 0),
    "21": (2364708844, 0, 0, 3),
    "foobar": (3214735720, 0, 0, 4),
}
COUNTS = (4, 12, 7)


def test_murmur2_and_the_home_partition_are_the_java_clients() -> None:
    got = {k: (murmur2(k.encode()), *(home_partition(k.encode(), n) for n in COUNTS)) for k in JAVA}
    assert got == JAVA


def test_sarama_partition_is_fnv1a_with_gos_signed_remainder() -> None:
    got = {
        k: (fnv1a_32(k.encode()), *(sarama_partition(k.encode(), n) for n in COUNTS))
        for k in SARAMA
    }
    assert got == SARAMA
    # "a" hashes negative as int32: abs(-468965076) % 7 = 6, where toPositive gives 3
    assert (fnv1a_32(b"a") & 0x7FFFFFFF) % 7 == 3


def test_crc32_is_the_standard_one() -> None:
    assert zlib.crc32(b"123456789") == 0xCBF43926
    assert crc32_partition(b"123456789", 7) == 0xCBF43926 % 7


@given(st.binary(max_size=64), st.integers(1, 64))
def test_the_home_partition_agrees_with_aiokafkas_default_partitioner(
    key: bytes, partitions: int
) -> None:
    from aiokafka.partitioner import DefaultPartitioner

    parts = list(range(partitions))
    assert home_partition(key, partitions) == DefaultPartitioner()(key, parts, parts)


@given(st.none() | st.binary(max_size=64), st.integers(1, 64))
def test_a_produced_records_partition_is_the_one_aiokafka_would_give_it(
    key: bytes | None, partitions: int
) -> None:
    from aiokafka.partitioner import DefaultPartitioner

    from prism.pipeline.worker._produce import key_partition

    parts = list(range(partitions))
    got = key_partition(key, parts)
    if key is None:  # no key: any partition, as aiokafka picks one at random
        assert got in parts
    else:
        assert got == DefaultPartitioner()(key, parts, parts)


def test_each_producer_pattern_is_named() -> None:
    n = 12
    run = RUN.encode()
    home = home_partition(run, n)
    crc, fnv = crc32_partition(run, n), sarama_partition(run, n)
    assert len({home, crc, fnv}) == 3  # the vector tells the three clients apart
    assert producer_pattern(None, run, crc, n) == NULL_KEY
    assert producer_pattern(b"", run, crc, n) == NULL_KEY  # librdkafka: an empty key is none
    assert producer_pattern(b"evt-1", run, home, n) == OTHER_KEY
    assert producer_pattern(run, run, crc, n) == CRC32_PATTERN
    assert producer_pattern(run, run, fnv, n) == FNV1A_PATTERN
    other = ({*range(n)} - {home, crc, fnv}).pop()
    assert producer_pattern(run, run, other, n) == UNKNOWN_PATTERN
    assert producer_pattern(b"evt", b"op-1", 0, n, field="operationId") == (
        "key is not the operationId (e.g. eventId)"
    )
    assert set(PRODUCER_PATTERNS) == {NULL_KEY, OTHER_KEY, CRC32_PATTERN, FNV1A_PATTERN,
                                      UNKNOWN_PATTERN}  # fmt: skip
