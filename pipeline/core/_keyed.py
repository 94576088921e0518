"""What every per-partition processor shares: keyed state, nested transactions, state writes.

A processor keeps one state object per key (a run, a channel operation) for one source
partition (or a file). ``begin`` / ``commit`` / ``rollback`` nest: a rollback restores each
key changed since its ``begin`` (copy-on-write: ``_save`` copies a key's state before its
first change), the partition's marks on the shared ``EventClock`` (its input's and its
forwarded copies', ``forwarded_lane``), the next source offsets and the time of the last
scan. ``_finish`` turns what changed into ``Output.state_writes``
(keys naming the partition, so a shared changelogged table can be split again) plus the
partition's meta record (its watermark mark and next offset per source).

A lane reads from up to two sources: its input topic partition and, when the pipeline
routes records to their run's home, the same partition of the repartition topic. Their
offsets are unrelated, so the next offset is kept per source name (meta ``so``); ``no``
stays beside it, the highest of them: the one offset of the format before, which is what
it was for a lane with one source. A meta record of that format is read as the offset of
the source ``load`` names (``""`` when it names none).

Subclasses say how a state is copied, decoded and indexed (``_copy``, ``_decode``,
``_index``, ``_unindex``) and which key prefixes they own (``ITEM_PREFIX``, ``META_PREFIX``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import orjson
from cramjam import lz4

from ._stateformat import STATE_FORMAT, StateKey, check_format
from ._types import CoreConfig, EventClock, Output, forwarded_lane

__all__ = ["GENERATION_SHIFT", "KeyedProcessor"]

GENERATION_SHIFT = 26  # bits of an item's own version; the generation takes the 38 above
_PACKED = b"\x00"  # marks an item put to rest compressed; a stored record begins with "{"


def _pack(raw: bytes) -> bytes:
    """An item's stored bytes as it rests (``_finish``): LZ4-compressed, about a third.

    Runs closed within the grace period rest until their shrink: at 10,000 events/s
    for 30 s that was ~540 B per event held (bench/README.md). LZ4 keeps ~190 of them
    for about 1 us per event in all, with the decompression at the shrink; zstd would
    keep ~125 for 3.5 us."""
    return _PACKED + lz4.compress_block(raw)  # the concatenation is the one copy


def _unpack(held: bytes) -> bytes:
    """The stored bytes of an item at rest: packed by ``_pack``, or as restored."""
    if held[:1] != _PACKED:
        return held
    return bytes(lz4.decompress_block(memoryview(held)[1:]))


class _State(Protocol):
    def to_bytes(self) -> bytes: ...


S = TypeVar("S", bound=_State)


@dataclass(slots=True)
class _Rested:
    """What ``rollback`` restores of an item replaced while at rest (``_replace_resting``):
    the bytes it rested in and what the subclass indexes it by (``_reindex_resting``)."""

    held: bytes
    index: Any


@dataclass(slots=True)
class _Tx:
    """What changed since ``begin``: each key's state as it was before its first change.
    Not generic: mypyc compiles no generic dataclass (``make compile``)."""

    items: dict[str, Any] = field(default_factory=dict)  # key -> an S, or None
    watermark_us: int = 0  # this partition's mark on the shared clock
    forwarded_us: int | None = None  # the mark of its forwarded copies (None: none yet)
    offsets: dict[str, int] = field(default_factory=dict)
    last_scan_us: int = 0
    scan_due: list[str] = field(default_factory=list)


class KeyedProcessor(Generic[S]):
    """Keyed state of one partition with nested transactions; see the module docstring."""

    ITEM_PREFIX: ClassVar[str] = "r"
    META_PREFIX: ClassVar[str] = "m"

    def __init__(
        self, config: CoreConfig | None = None, partition: int = -1, clock: EventClock | None = None
    ) -> None:
        self.config = config or CoreConfig()
        self.partition = partition
        self.clock = clock or EventClock(self.config.max_clock_skew_s)
        self.items: dict[str, S] = {}
        # items in their stored bytes: restored and not decoded yet (``_load_item``), or
        # written and put to rest (``_rests``); ``_get`` decodes one when next asked for;
        # every key is in ``items`` or here, never both; one put to rest is packed (``_pack``)
        self._cold: dict[str, bytes] = {}
        self.offsets: dict[str, int] = {}  # source -> next offset to process (set by the shell)
        # the clock key the events processed move: the partition, or its forwarded copies'
        self.mark_key = partition
        self._last_scan_us = 0
        self._scan_due: list[str] = []  # keys to judge at the next scan, though time stood
        self._dirty: set[str] = set()
        self._dropped: set[str] = set()
        # items replaced while at rest (``_replace_resting``) -> the state record to write
        self._rewrites: dict[str, bytes] = {}
        self._tx: list[_Tx] = []
        self.generation = 0  # the lane's owner generation (``row_version``); files: 0

    def row_version(self, version: int) -> int:
        """The ledger version of a row an item of ``version`` writes: the lane's generation
        above the item's own. A worker that restores a lane takes a generation above every
        earlier owner's (``worker/_slots.py``), so its rows outrank whatever an earlier
        owner inserted and never committed (a batch stepped, stored, then lost to a crash
        or a fence): rows of the same event from a different batch cut, which the new
        owner's own versions alone need not exceed."""
        return (self.generation << GENERATION_SHIFT) | version

    @property
    def watermark_us(self) -> int:
        return self.clock.watermark_us

    @property
    def next_offset(self) -> int | None:
        """The highest next offset over the sources (a lane with one source: its offset)."""
        return max(self.offsets.values(), default=None)

    def advance(self, source: str, next_offset: int) -> None:
        """The records of ``source`` before ``next_offset`` were processed."""
        if next_offset > self.offsets.get(source, 0):
            self.offsets[source] = next_offset

    # -- subclass hooks -----------------------------------------------------------------
    def _copy(self, item: S) -> S:
        raise NotImplementedError

    def _decode(self, raw: bytes) -> S:
        raise NotImplementedError

    def _load_item(self, key: str, raw: bytes) -> None:
        """Restore one stored item (``load``); a subclass may leave it in ``_cold``."""
        self._index(self._decode(raw))

    def _rests(self, item: S) -> bool:
        """Whether an item just written may wait in its stored bytes (``_cold``) until it
        is next asked for (``_get``), as a restored one does (``_load_item``)."""
        return False

    def _index(self, item: S) -> None:
        """Put a (restored or reverted) state in ``items`` and the subclass's indexes."""
        raise NotImplementedError

    def _unindex(self, key: str) -> None:
        """Take a key out of the subclass's indexes (before a rollback restores it)."""

    def _reindex_resting(self, key: str, index: Any) -> None:
        """Index again an item ``rollback`` puts back at rest (``_replace_resting``'s
        ``index``)."""
        raise NotImplementedError

    # -- state keys -----------------------------------------------------------------------
    @property
    def meta_key(self) -> str:
        return str(StateKey(self.META_PREFIX, self.partition))

    def item_key(self, key: str) -> str:
        """State key of an item; it names the partition so a shared table can be split again."""
        return str(StateKey(self.ITEM_PREFIX, self.partition, key))

    def owns_key(self, key: str) -> bool:
        """Whether a state key belongs to this partition's processor."""
        parsed = StateKey.of(key)
        return (
            parsed is not None
            and parsed.lane == self.partition
            and parsed.kind in (self.ITEM_PREFIX, self.META_PREFIX)
        )

    def load(self, items: Iterable[tuple[str, bytes]], source: str | None = None) -> None:
        """Restore state written earlier by ``Output.state_writes`` (e.g. from a changelog).

        Keys of other kinds (another processor's) are ignored. ``source``: the input topic
        a meta record of the format before per-source offsets counts its one offset for.
        """
        for key, value in items:
            parsed = StateKey.of(key)
            if parsed is None or parsed.lane != self.partition:
                continue
            if parsed.kind == self.ITEM_PREFIX and parsed.name is not None:
                self._load_item(parsed.name, value)
            elif parsed.kind == self.META_PREFIX and parsed.name is None:
                meta = check_format(orjson.loads(value), key)
                mark = max(self.clock.mark(self.partition), meta["wm"])
                self.clock.set_mark(self.partition, mark)
                copies = meta.get("wf")
                if isinstance(copies, int):
                    lane = forwarded_lane(self.partition)
                    self.clock.set_mark(lane, max(self.clock.mark(lane), copies))
                self.offsets = _offsets(meta, source)
                self._load_meta(meta)
        self._loaded()

    def _load_meta(self, meta: dict[str, object]) -> None:
        """Subclass fields kept in the meta record (see ``_meta``)."""

    def _meta(self) -> dict[str, object]:
        return {}

    def _loaded(self) -> None:
        """Called once ``load`` has indexed every state (e.g. to sort time queues)."""

    # -- transactions (poison isolation) ------------------------------------------------
    def begin(self) -> None:
        """Start remembering changes, so ``rollback`` can undo them; transactions nest."""
        self._tx.append(
            _Tx(
                watermark_us=self.clock.mark(self.partition),
                forwarded_us=self._forwarded_mark(),
                offsets=dict(self.offsets),
                last_scan_us=self._last_scan_us,
                scan_due=list(self._scan_due),
            )
        )

    def commit(self) -> None:
        """Keep the changes since the matching ``begin``."""
        done = self._tx.pop()
        if self._tx:
            outer = self._tx[-1].items
            for key, before in done.items.items():
                outer.setdefault(key, before)

    def rollback(self) -> None:
        """Undo every change since the matching ``begin`` (its outputs must not be used)."""
        tx = self._tx.pop()
        for key, before in tx.items.items():
            self._unindex(key)
            self._dirty.discard(key)
            self._dropped.discard(key)
            self._rewrites.pop(key, None)
            self._cold.pop(key, None)  # what ``_finish`` left in its bytes is void too
            if before is None:
                self.items.pop(key, None)
            elif isinstance(before, _Rested):
                self.items.pop(key, None)
                self._cold[key] = before.held
                self._reindex_resting(key, before.index)
            else:
                self._index(before)
        self.clock.set_mark(self.partition, tx.watermark_us)
        self.clock.restore(forwarded_lane(self.partition), tx.forwarded_us)
        self.offsets = tx.offsets
        self._last_scan_us = tx.last_scan_us
        self._scan_due = tx.scan_due

    def _forwarded_mark(self) -> int | None:
        key = forwarded_lane(self.partition)
        return self.clock.mark(key) if self.clock.has_mark(key) else None

    def _get(self, key: str) -> S | None:
        """The item of ``key`` (None: none), decoded now if it was restored cold."""
        item = self.items.get(key)
        if item is None:
            raw = self._cold.pop(key, None)
            if raw is not None:
                item = self.items[key] = self._decode(_unpack(raw))
        return item

    @property
    def size(self) -> int:
        """How many items the partition holds, decoded or not."""
        return len(self.items) + len(self._cold)

    def thawed(self) -> dict[str, S]:
        """Every item, decoded (tests and tools; the step decodes only what it touches)."""
        for key in list(self._cold):
            self._get(key)
        return self.items

    def _save(self, key: str) -> None:
        """Called before a key changes: inside a transaction, keep a copy of it as it was."""
        if self._tx:
            saved = self._tx[-1].items
            if key not in saved:
                item = self._get(key)
                saved[key] = None if item is None else self._copy(item)

    def _replace_resting(self, key: str, held: bytes, index: Any) -> None:
        """Replace an item at rest by another state record, ``held`` as it rests (packed
        by ``_pack`` or not: ``_unpack`` reads both), without decoding either: the record
        is written at ``_finish``.
        ``index``: what ``_reindex_resting`` needs should a rollback put the item back as
        it rested."""
        if self._tx:
            saved = self._tx[-1].items
            if key not in saved:
                saved[key] = _Rested(self._cold[key], index)
        self._cold[key] = held
        self._rewrites[key] = _unpack(held)

    def _drop(self, key: str) -> None:
        """Forget a key for good (retention): its state key is deleted at ``_finish``."""
        self._save(key)
        self._cold.pop(key, None)
        self.items.pop(key, None)
        self._unindex(key)
        self._dirty.discard(key)
        self._dropped.add(key)

    def _finish(self, out: Output) -> Output:
        """Record the state writes of what changed (and the meta record) in ``out``."""
        writes = out.state_writes
        for key, raw in self._rewrites.items():  # an item changed since overrides it below
            writes[self.item_key(key)] = raw
        for key in self._dirty:
            item = self.items[key]
            raw = writes[self.item_key(key)] = item.to_bytes()
            if self._rests(item):  # its bytes are made anyway, and hold it in far less
                del self.items[key]
                self._cold[key] = _pack(raw)
        for key in self._dropped:
            writes[self.item_key(key)] = None
        meta = {
            "v": STATE_FORMAT,
            "wm": self.clock.mark(self.partition),
            "no": self.next_offset,
            "so": self.offsets,
            **self._meta(),
        }
        copies = self._forwarded_mark()
        if copies is not None:
            meta["wf"] = copies
        writes[self.meta_key] = orjson.dumps(meta)
        self._dirty.clear()
        self._dropped.clear()
        self._rewrites.clear()
        return out


def _offsets(meta: dict[str, object], source: str | None) -> dict[str, int]:
    """The next offset per source of a meta record, of either format."""
    per_source = meta.get("so")
    if isinstance(per_source, dict):
        return {str(k): int(v) for k, v in per_source.items()}
    single = meta.get("no")
    return {} if not isinstance(single, int) else {source or "": single}
