"""The on-disk spool: segment format, torn tails after a crash, bounds, order, acknowledgement."""

from __future__ import annotations

import logging
import os
import signal
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from prism.runtime import Record, SpoolError
from prism.runtime._segment import MAGIC, decode_record, encode_record
from prism.runtime._spool import Spool

pytestmark = pytest.mark.timeout(60)


def rec(i: int, size: int = 40) -> Record:
    return Record(
        f"run-{i % 7}".encode(),
        b'{"seq":%d,"pad":"%s"}' % (i, b"x" * size),
        (("content-type", b"application/json"), ("traceparent", b"00-%032x-%016x-01" % (i, i))),
    )


def fill(spool: Spool, seqs: range, size: int = 40) -> None:
    for i in seqs:
        assert spool.append(i, rec(i, size)), f"no room for seq {i}"


def read_all(spool: Spool, from_seq: int = 0, chunk: int = 7) -> list[int]:
    seqs: list[int] = []
    at = from_seq
    while at < spool.next_seq:
        got, at = spool.read(at, chunk)
        seqs += [s for s, _ in got]
    return seqs


def segments(d: Path) -> list[Path]:
    return sorted(d.glob("*.seg"))


def test_a_record_round_trips_with_key_headers_and_value() -> None:
    r = Record(b"run-\xc3\xa9", b'{"a":1}', (("content-type", b"application/json"), ("x", b"")))
    assert decode_record(encode_record(r)) == r
    assert decode_record(encode_record(Record(b"k", b"", ()))) == Record(b"k", b"", ())
    with pytest.raises(ValueError, match=r"does not parse|shorter"):
        decode_record(b"\x00\x05ab")


def test_a_segment_is_magic_then_length_crc_seq_framed_records(tmp_path: Path) -> None:
    spool = Spool(tmp_path, segment_bytes=1024, max_bytes=4096, fsync="never")
    fill(spool, range(3, 5))
    spool.close()
    (seg,) = segments(tmp_path)
    assert seg.name == f"{3:020d}.seg"  # named by its first seq
    data = seg.read_bytes()
    assert data[:8] == MAGIC == b"PRSPOOL1"
    pos, seen = 8, []
    while pos < len(data):
        length, crc, seq = struct.unpack_from(">IIQ", data, pos)
        payload = data[pos + 16 : pos + 16 + length]
        assert crc == zlib.crc32(payload, zlib.crc32(struct.pack(">Q", seq)))
        assert decode_record(payload) == rec(seq)
        seen.append(seq)
        pos += 16 + length
    assert (seen, pos) == ([3, 4], len(data))


def test_records_come_back_in_order_across_segments_and_reopens(tmp_path: Path) -> None:
    spool = Spool(tmp_path, segment_bytes=1024, max_bytes=64 * 1024, fsync="never")
    fill(spool, range(0, 60))
    spool.close()
    assert len(segments(tmp_path)) > 3  # rolled at segment_bytes
    spool = Spool(tmp_path, segment_bytes=1024, max_bytes=64 * 1024, fsync="never")
    assert (spool.next_seq, spool.backlog, spool.acked, spool.corrupt) == (60, 60, 0, 0)
    fill(spool, range(60, 75))  # appends go to a new segment, after the old ones
    assert read_all(spool) == list(range(75))
    assert read_all(spool, from_seq=33, chunk=1000) == list(range(33, 75))
    got, after = spool.read(10, 5)
    assert ([s for s, _ in got], after) == ([10, 11, 12, 13, 14], 15)
    assert got[0][1] == rec(10)
    spool.close()


def test_sequence_numbers_may_have_gaps_but_never_go_back(tmp_path: Path) -> None:
    spool = Spool(tmp_path, fsync="never")
    fill(spool, range(0, 3))
    assert spool.append(10, rec(10))
    assert read_all(spool) == [0, 1, 2, 10]
    with pytest.raises(ValueError, match="seq 5 is not above the last one \\(10\\)"):
        spool.append(5, rec(5))
    spool.close()


def test_ack_persists_the_watermark_and_deletes_spent_segments(tmp_path: Path) -> None:
    spool = Spool(tmp_path, segment_bytes=1024, max_bytes=64 * 1024, fsync="never")
    fill(spool, range(0, 60))
    before = spool.size_bytes
    firsts = [int(p.name[:20]) for p in segments(tmp_path)]
    assert spool.ack(firsts[2]) is True  # the first two segments are wholly below it
    assert [int(p.name[:20]) for p in segments(tmp_path)] == firsts[2:]
    assert spool.size_bytes < before
    assert spool.ack(firsts[2] + 1) is False  # nothing whole to delete
    spool.close()
    spool = Spool(tmp_path, segment_bytes=1024, max_bytes=64 * 1024, fsync="never")
    assert (spool.acked, spool.backlog, spool.next_seq) == (firsts[2] + 1, 59 - firsts[2], 60)
    assert read_all(spool, spool.acked) == list(range(firsts[2] + 1, 60))
    spool.ack(60)
    spool.close()
    spool = Spool(tmp_path, segment_bytes=1024, max_bytes=64 * 1024, fsync="never")
    assert (spool.backlog, spool.next_seq, segments(tmp_path)) == (0, 60, [])
    spool.close()


@pytest.mark.parametrize(
    "cut",
    [3, 16, 17, -1],
    ids=["inside-the-header", "header-only", "one-payload-byte", "last-byte-missing"],
)
def test_a_torn_last_record_is_skipped_counted_and_logged(
    tmp_path: Path, cut: int, caplog: pytest.LogCaptureFixture
) -> None:
    spool = Spool(tmp_path, fsync="never")
    fill(spool, range(0, 10))
    spool.close()
    (seg,) = segments(tmp_path)
    data = seg.read_bytes()
    last = len(encode_record(rec(9))) + 16
    keep = len(data) - last + (cut if cut >= 0 else last - 1)
    seg.write_bytes(data[:keep])  # the crash hit while seq 9 was being written
    with caplog.at_level(logging.WARNING, logger="runtime.publisher"):
        spool = Spool(tmp_path, fsync="never")
    assert (spool.corrupt, spool.backlog, spool.next_seq) == (1, 9, 9)
    assert any(seg.name in r.getMessage() and "torn" in r.getMessage() for r in caplog.records)
    fill(spool, range(9, 12))  # seq 9 written again by the restarted runtime: a new segment
    assert read_all(spool) == list(range(12))
    spool.close()


def test_a_damaged_record_ends_its_segment_but_not_the_spool(tmp_path: Path) -> None:
    spool = Spool(tmp_path, segment_bytes=1024, max_bytes=64 * 1024, fsync="never")
    fill(spool, range(0, 40))
    spool.close()
    first, second, *_ = segments(tmp_path)
    data = bytearray(first.read_bytes())
    data[8 + 16 + 5] ^= 0xFF  # a bit flip inside the first record's payload
    first.write_bytes(bytes(data))
    spool = Spool(tmp_path, segment_bytes=1024, max_bytes=64 * 1024, fsync="never")
    assert spool.corrupt == 1
    later = int(second.name[:20])
    assert read_all(spool) == list(range(later, 40))  # the damaged segment yields nothing
    spool.close()


def test_garbage_files_and_a_damaged_ack_file_never_stop_the_spool(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool = Spool(tmp_path, fsync="never")
    fill(spool, range(0, 5))
    spool.ack(3)
    spool.close()
    (tmp_path / "ack").write_bytes(b"\x00garbage")
    (tmp_path / "notes.seg").write_text("not ours")
    (tmp_path / f"{99:020d}.seg").write_bytes(b"NOTMAGIC" + b"\x00" * 30)
    with caplog.at_level(logging.WARNING, logger="runtime.publisher"):
        spool = Spool(tmp_path, fsync="never")
    # The watermark is lost, so everything is replayed (the pipeline drops the copies).
    assert (spool.acked, spool.backlog, spool.corrupt) == (0, 5, 2)
    assert read_all(spool) == [0, 1, 2, 3, 4]
    text = caplog.text
    assert "ack file" in text and "bad magic" in text and "notes.seg" in text
    spool.close()


def test_a_killed_writer_leaves_a_readable_prefix(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from prism.runtime._spool import Spool\n"
        "from prism.runtime import Record\n"
        "s = Spool(sys.argv[1], segment_bytes=4096, max_bytes=1 << 30, fsync='never')\n"
        "i = 0\n"
        "while True:\n"
        "    s.append(i, Record(b'k', b'%d' % i + b'y' * 300, ()))\n"
        "    if i == 2000: print('ready', flush=True)\n"
        "    i += 1\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    spool = Spool(tmp_path, segment_bytes=4096, max_bytes=1 << 30, fsync="never")
    seqs = read_all(spool, chunk=500)
    assert len(seqs) > 2000 and seqs == list(range(len(seqs)))
    assert spool.backlog == len(seqs) and spool.corrupt <= 1
    got, _ = spool.read(len(seqs) - 1, 1)
    assert got[0][1].value.startswith(b"%d" % (len(seqs) - 1))
    spool.close()


def test_the_spool_never_grows_past_max_bytes_and_acks_make_room(tmp_path: Path) -> None:
    spool = Spool(tmp_path, segment_bytes=1024, max_bytes=4096, fsync="never")
    i = 0
    while spool.append(i, rec(i)):
        i += 1
    assert 20 < i < 60 and spool.size_bytes <= 4096
    assert not spool.append(i, rec(i))
    assert not spool.can_free(3)  # the first segment still holds undelivered records
    assert spool.can_free(i)
    assert spool.ack(i)  # all delivered: spent segments go (the active one too when needed)
    fill(spool, range(i, 2 * i - 3))  # nearly as many again
    assert spool.size_bytes <= 4096
    assert read_all(spool, spool.acked) == list(range(i, 2 * i - 3))
    spool.close()


def test_one_process_per_spool_directory(tmp_path: Path) -> None:
    first = Spool(tmp_path)
    with pytest.raises(SpoolError, match=rf"{tmp_path}.*in use.*pid {os.getpid()}"):
        Spool(tmp_path)
    first.close()
    Spool(tmp_path).close()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"fsync": "sometimes"}, "fsync must be 'always', 'interval' or 'never', got 'sometimes'"),
        ({"max_bytes": 3000, "segment_bytes": 2048}, r"max_bytes \(3000\) must hold at least two"),
        ({"segment_bytes": 10}, "segment_bytes must be >= 1024, got 10"),
        ({"fsync_interval": 0}, "fsync_interval must be > 0 seconds, got 0"),
    ],
)
def test_bad_settings_are_refused_naming_the_value(
    tmp_path: Path, kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(SpoolError, match=message):
        Spool(tmp_path, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(("policy", "expected"), [("always", 20), ("never", 0), ("interval", 1)])
def test_the_fsync_policy_decides_how_often_records_hit_the_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, policy: str, expected: int
) -> None:
    spool = Spool(tmp_path, fsync=policy, fsync_interval=3600)  # type: ignore[arg-type]
    spool.append(0, rec(0))  # opens the first segment (a directory sync of its own)
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd)))
    fill(spool, range(1, 21))
    if policy == "interval":
        spool._last_sync -= 3600  # the interval has passed
        spool.sync_if_due()
        spool.sync_if_due()  # nothing new since: no second sync
    assert len(synced) == expected
    spool.close()


def test_a_record_keeps_its_topic_through_the_spool() -> None:
    from prism.runtime._base import Record
    from prism.runtime._segment import decode_record, encode_record

    rec = Record(
        b"op-1", b"{}", (("content-type", b"application/json"),), "prism.channel-operations"
    )
    assert decode_record(encode_record(rec)) == rec
    plain = Record(b"run-1", b"{}", ())
    assert decode_record(encode_record(plain)) == plain
