"""The publisher's bounded on-disk spool: append-only segments of length- and CRC-framed records.

A spool directory holds ``lock`` (one publisher process at a time), ``ack`` (the
watermark: every record below it was delivered) and segment files named by the first
sequence number they hold (``00000000000000000042.seg``). A segment starts with the
8-byte magic ``PRSPOOL1``; each record is::

    length u32 | crc32 u32 | seq u64 | payload (length bytes)

big-endian, the CRC covering ``seq`` and ``payload`` (``runtime._segment``). Writes are
single ``os.write`` calls on an ``O_APPEND`` descriptor, so a killed process leaves at
worst one torn record at the tail of the active segment. Opening a spool reads every
segment; a record whose frame or CRC does not check (a crash mid-write, a damaged disk)
ends that segment's readable part: the rest is skipped, counted in ``corrupt`` and
logged, never raised. Writing always continues in a new segment.

``fsync`` decides durability against a power loss (a process crash loses nothing the
kernel took): ``"always"`` syncs after every record (slowest; each ``publish()`` waits
for the disk), ``"interval"`` at most every ``fsync_interval`` seconds (the default),
``"never"`` leaves it to the operating system.

Example::

    spool = Spool(Path(".data/spool"), max_bytes=64 * 2**20)
    spool.append(0, Record(b"run-1", b"{...}", ()))
    records, next_seq = spool.read(spool.acked, limit=100)
    spool.ack(next_seq)        # delivered: whole segments below it are deleted
    spool.close()
"""

from __future__ import annotations

import fcntl
import logging
import os
import struct
import time
import zlib
from pathlib import Path
from typing import Literal

from ._base import Record
from ._errors import SpoolError
from ._segment import FRAME, MAGIC, SEQ, Segment, check, decode_record, encode_record, frame

__all__ = [
    "DEFAULT_SEGMENT_BYTES",
    "DEFAULT_SPOOL_BYTES",
    "FsyncPolicy",
    "Spool",
    "SpoolError",
]

log = logging.getLogger("runtime.publisher")

FsyncPolicy = Literal["always", "interval", "never"]
DEFAULT_SPOOL_BYTES = 256 * 2**20
DEFAULT_SEGMENT_BYTES = 16 * 2**20
_ACK = struct.Struct(">QI")  # watermark, crc32 of the watermark bytes
_SUFFIX = ".seg"
_READ_BUFFER = 1 << 20


class Spool:
    """Append-only segments under ``directory`` holding at most ``max_bytes``; see the module."""

    def __init__(
        self,
        directory: str | Path,
        *,
        max_bytes: int = DEFAULT_SPOOL_BYTES,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        fsync: FsyncPolicy = "interval",
        fsync_interval: float = 1.0,
    ) -> None:
        if fsync not in ("always", "interval", "never"):
            raise SpoolError(f"fsync must be 'always', 'interval' or 'never', got {fsync!r}")
        if segment_bytes < 1024:
            raise SpoolError(f"segment_bytes must be >= 1024, got {segment_bytes!r}")
        if max_bytes < 2 * segment_bytes:
            raise SpoolError(
                f"max_bytes ({max_bytes!r}) must hold at least two segments of "
                f"segment_bytes ({segment_bytes!r}); raise max_bytes or lower segment_bytes"
            )
        if fsync_interval <= 0:
            raise SpoolError(f"fsync_interval must be > 0 seconds, got {fsync_interval!r}")
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self.fsync_interval = fsync_interval
        self.corrupt = 0  # corrupt or torn segment tails skipped
        self._lock_fd: int | None = self._lock()
        self._active: Segment | None = None
        self._fd: int | None = None
        self._dirty = False
        self._last_sync = time.monotonic()
        self._cursor: tuple[Segment, int, int] | None = None  # where the last read stopped
        self._ack_synced = True
        self.acked = self._read_ack()
        scanned = [self._scan(p) for p in sorted(self.directory.glob(f"*{_SUFFIX}"))]
        self._segments = sorted((s for s in scanned if s is not None), key=lambda s: s.first_seq)
        self._drop_acked()
        last = max((s.last_seq for s in self._segments), default=-1)
        self.next_seq = max(self.acked, last + 1)
        self.backlog = sum(s.live for s in self._segments)  # records an earlier process left

    # -- opening --------------------------------------------------------------------------
    def _lock(self) -> int:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.directory / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise SpoolError(f"cannot open the spool directory {self.directory}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise SpoolError(
                f"the spool directory {self.directory} is in use by another publisher "
                f"(pid {holder}); give each publisher process its own spool directory"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd

    def _read_ack(self) -> int:
        path = self.directory / "ack"
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return 0
        if len(raw) == _ACK.size:
            watermark, crc = _ACK.unpack(raw)
            if zlib.crc32(SEQ.pack(watermark)) == crc:
                return int(watermark)
        self.corrupt += 1
        log.warning(
            "the spool's ack file %s is damaged (%d bytes); replaying every record left in "
            "the spool (the pipeline drops the duplicates by eventId)",
            path, len(raw),
        )  # fmt: skip
        return 0

    def _scan(self, path: Path) -> Segment | None:
        try:
            first = int(path.name.removesuffix(_SUFFIX))
            data = path.read_bytes()
        except (ValueError, OSError) as exc:
            log.warning("ignoring %s in the spool directory: %s", path, exc)
            return None
        seg = Segment(path, first, size=len(data))
        if len(data) < len(MAGIC):  # created, killed before the magic was written
            seg.readable = len(data)
            return seg
        if data[: len(MAGIC)] != MAGIC:
            self._torn(seg, 0, "not a spool segment (bad magic)")
            seg.readable = 0
            return seg
        pos = len(MAGIC)
        while pos < len(data):
            problem = check(data, pos)
            if problem:
                self._torn(seg, pos, problem)
                break
            length, _, seq = FRAME.unpack_from(data, pos)
            seg.last_seq = seq
            seg.records += 1
            seg.live += seq >= self.acked
            pos += FRAME.size + length
        seg.readable = pos
        return seg

    def _torn(self, seg: Segment, pos: int, problem: str) -> None:
        self.corrupt += 1
        log.warning(
            "spool segment %s: %s at byte %d; skipping its last %d byte(s) (a crash "
            "mid-write leaves a torn record; anything else there is lost)",
            seg.path, problem, pos, seg.size - pos,
        )  # fmt: skip

    # -- writing --------------------------------------------------------------------------
    @property
    def size_bytes(self) -> int:
        """Bytes the segment files take on disk (counted against ``max_bytes``)."""
        return sum(s.size for s in self._segments)

    def append(self, seq: int, record: Record) -> bool:
        """Write one record; ``False`` (nothing written) when it would pass ``max_bytes``.

        ``seq`` must be above every sequence number written so far. Raises ``OSError``
        when the disk refuses the write (the caller treats that as a full spool).
        """
        if seq < self.next_seq:
            raise ValueError(f"spool seq {seq} is not above the last one ({self.next_seq - 1})")
        framed = frame(seq, encode_record(record))
        roll = self._active is None or self._active.size >= self.segment_bytes
        need = len(framed) + (len(MAGIC) if roll else 0)
        if self.size_bytes + need > self.max_bytes:
            active = self._active
            if active is None or active.last_seq >= self.acked or active.records == 0:
                return False
            self._close_fd()  # the active segment is all delivered: reclaim it
            active.path.unlink(missing_ok=True)
            self._segments.remove(active)
            roll, need = True, len(framed) + len(MAGIC)
            if self.size_bytes + need > self.max_bytes:
                return False
        if roll:
            self._roll(seq)
        assert self._active is not None and self._fd is not None
        written = os.write(self._fd, framed)
        if written != len(framed):  # a short write (disk full): take it back
            os.ftruncate(self._fd, self._active.size)
            raise OSError(f"short write to {self._active.path}: {written} of {len(framed)} bytes")
        seg = self._active
        seg.size += len(framed)
        seg.readable = seg.size
        seg.last_seq = seq
        seg.records += 1
        self.next_seq = seq + 1
        self._dirty = True
        if self.fsync == "always":
            self.sync()
        elif self.fsync == "interval":
            self.sync_if_due()
        return True

    def _roll(self, first_seq: int) -> None:
        self._close_fd()
        path = self.directory / f"{first_seq:020d}{_SUFFIX}"
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        os.write(self._fd, MAGIC)
        self._active = Segment(path, first_seq, size=len(MAGIC))
        self._segments.append(self._active)
        if self.fsync != "never":
            _sync_dir(self.directory)

    def sync(self) -> None:
        """Flush written records to the disk now (``fsync``)."""
        if self._fd is not None and self._dirty:
            os.fsync(self._fd)
        self._dirty = False
        self._last_sync = time.monotonic()

    def sync_if_due(self) -> None:
        """``sync()`` when the ``"interval"`` policy's time has come (call it now and then)."""
        if (
            self.fsync == "interval"
            and self._dirty
            and time.monotonic() - self._last_sync >= self.fsync_interval
        ):
            self.sync()

    # -- reading and acknowledging -----------------------------------------------------------
    def read(self, from_seq: int, limit: int) -> tuple[list[tuple[int, Record]], int]:
        """Up to ``limit`` records with ``seq >= from_seq`` in order, and the seq to read next.

        The seq to read next is ``next_seq`` once the end of the spool was reached. Reading
        on from where the last call stopped costs only the bytes read.
        """
        out: list[tuple[int, Record]] = []
        for seg in self._segments:
            if seg.last_seq < from_seq:
                continue
            self._read_seg(seg, from_seq, limit, out)
            if len(out) >= limit:
                return out, out[-1][0] + 1
        return out, self.next_seq

    def _read_seg(
        self, seg: Segment, from_seq: int, limit: int, out: list[tuple[int, Record]]
    ) -> None:
        cur = self._cursor
        pos = cur[1] if cur and cur[0] is seg and cur[2] <= from_seq else len(MAGIC)
        try:
            f = open(seg.path, "rb", buffering=_READ_BUFFER)  # noqa: SIM115  (closed below)
        except OSError as exc:
            log.error("cannot read spool segment %s: %s; its records are skipped", seg.path, exc)
            seg.readable = 0
            return
        with f:
            f.seek(pos)
            while pos < seg.readable and len(out) < limit:
                head = f.read(FRAME.size)
                length, _, seq = FRAME.unpack(head) if len(head) == FRAME.size else (0, 0, 0)
                body = f.read(length) if len(head) == FRAME.size else b""
                problem = check(head + body, 0)
                if problem:  # the file changed on disk since it was scanned
                    self._torn(seg, pos, problem)
                    seg.readable = pos
                    return
                pos += FRAME.size + length
                if seq < from_seq:
                    continue
                try:
                    out.append((seq, decode_record(body)))
                except ValueError as exc:  # CRC fine, content not ours: skip the one record
                    self.corrupt += 1
                    log.warning("spool segment %s, seq %d: %s; skipped", seg.path, seq, exc)
                self._cursor = (seg, pos, seq + 1)

    def ack(self, watermark: int) -> bool:
        """Every record below ``watermark`` is delivered: persist it, delete spent segments.

        Returns ``True`` when space was freed. The ack file is synced at once only under
        ``"always"`` (otherwise at ``close()``): a lost acknowledgement only means records
        sent again, which the pipeline drops by ``eventId``.
        """
        if watermark <= self.acked:
            return False
        self.acked = watermark
        raw = SEQ.pack(watermark)
        tmp = self.directory / "ack.tmp"
        with open(tmp, "wb") as f:
            f.write(_ACK.pack(watermark, zlib.crc32(raw)))
            if self.fsync == "always":
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, self.directory / "ack")
        self._ack_synced = self.fsync == "always"
        return self._drop_acked()

    def can_free(self, watermark: int) -> bool:
        """Whether ``ack(watermark)`` (or the next ``append``) could delete a segment."""
        return watermark > self.acked and any(
            seg.records and seg.last_seq < watermark for seg in self._segments
        )

    def _drop_acked(self) -> bool:
        keep, freed = [], False
        for seg in self._segments:
            spent = seg.last_seq < self.acked and (
                seg is not self._active or seg.size >= self.segment_bytes
            )
            if spent:
                if seg is self._active:
                    self._close_fd()
                seg.path.unlink(missing_ok=True)
                freed = True
            else:
                keep.append(seg)
        self._segments = keep
        return freed

    # -- closing --------------------------------------------------------------------------
    def _close_fd(self) -> None:
        if self._fd is not None:
            if self.fsync != "never" and self._dirty:
                os.fsync(self._fd)
                self._dirty = False
            os.close(self._fd)
        self._fd = None
        self._active = None

    def close(self) -> None:
        """Sync (unless ``"never"``), close the active segment and release the directory.

        Segments holding only delivered records are deleted, so a publisher that closed
        after delivering everything leaves no segment behind.
        """
        self._close_fd()
        for seg in [s for s in self._segments if s.last_seq < self.acked]:
            seg.path.unlink(missing_ok=True)
            self._segments.remove(seg)
        if not self._ack_synced and self.fsync != "never":
            fd = os.open(self.directory / "ack", os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            _sync_dir(self.directory)
            self._ack_synced = True
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def __repr__(self) -> str:
        return (
            f"Spool({str(self.directory)!r}, {self.size_bytes}/{self.max_bytes} bytes, "
            f"next_seq={self.next_seq}, acked={self.acked}, fsync={self.fsync!r})"
        )


def _sync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
