"""``rebuild``: replay the input topics from their earliest offsets into a fresh ledger database.

Both inputs: the agent events and, when the topic exists, the channel operations (each
topic partition its own intake lane, as in the worker).

The same intake step as the worker (``core.Intake``), fed the same way: records with their
Kafka positions, one processor per source partition sharing the pipeline watermark, limit
deaths through one ``ExhaustionAlerter``, rows through the shells' ``LedgerStore``. It
stops at the end offsets captured when it started,
reads without a consumer group (no offset is committed anywhere) and produces nothing, so
the live worker and its output topics are untouched. Grace periods that were still open at
the end are treated as elapsed, as the live worker's timer would.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiokafka import TopicPartition

from .._store import LedgerStore
from ..core import ExhaustionAlerter, InRecord, Intake, Output, store_isolating
from ..ingest import LedgerTally, render_counts
from ..settings import Settings
from ..worker._lanes import lane_of
from ..worker._records import in_record
from ._errors import RebuildRefused, TopicNotFound
from ._ledger import _check_identifier
from ._tail import _consumer, topic_partitions

__all__ = ["RebuildSummary", "rebuild"]

log = logging.getLogger("prism.replay")

_POLL_MS = 1000


@dataclass(slots=True)
class RebuildSummary:
    """What a rebuild read and wrote; ``render()`` is what the CLI prints."""

    database: str
    topic: str
    offsets: dict[int, tuple[int, int]] = field(default_factory=dict)  # lane -> (begin, end)
    records: int = 0
    dead_letters: int = 0
    alerts: int = 0
    stats: Counter[str] = field(default_factory=Counter)
    runs_by_status: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def total(self) -> int:
        """Offsets to replay: the sum of end minus beginning offsets over the partitions."""
        return sum(end - begin for begin, end in self.offsets.values())

    def render(self) -> str:
        return "\n".join(
            [
                f"rebuilt into:    {self.database} (from {self.topic}, "
                f"{len(self.offsets)} partitions)",
                f"records read:    {self.records} of {self.total} offsets in {self.seconds:.1f}s",
                f"events applied:  {self.stats['applied']}",
                f"duplicates:      {self.stats['duplicate']}",
                "runs by status:  "
                + (", ".join(f"{k}={v}" for k, v in sorted(self.runs_by_status.items())) or "none"),
                f"dead letters:    {self.dead_letters}",
                f"quarantined:     {render_counts(self.stats, 'quarantine')}",
                f"alerts:          {self.alerts}",
            ]
        )


async def rebuild(
    settings: Settings,
    client: Any,
    database: str,
    *,
    force: bool = False,
    progress: bool = False,
    batch_size: int = 5000,
    clock: Callable[[], float] = time.time,
) -> RebuildSummary:
    """Replay ``settings``' input topic from the earliest offsets into ``database``.

    The database is migrated first; one that already holds runs is refused
    (``RebuildRefused``) unless ``force``. ``progress`` shows a tqdm bar on stderr.

    Example::

        client = sinks.connect("chdb://./.data/ledger", "prism_rebuilt")
        summary = await rebuild(load_settings(), client, "prism_rebuilt", progress=True)
        print(summary.render())
    """
    from prism import sinks

    _check_identifier(database)
    existing = _runs_in(client, database)
    if existing and not force:
        raise RebuildRefused(
            f"database {database!r} already holds {existing} runs; rebuild into a new database "
            "(--database NEW_DB) or pass --force to write into this one anyway"
        )
    sinks.migrate(
        client,
        database,
        cluster=settings.clickhouse_cluster,
        raw_event_ttl_days=settings.raw_event_ttl_days,
    )
    writer = sinks.LedgerWriter(client, database)
    topic = settings.topics.input
    tps = [TopicPartition(topic, p) for p in await topic_partitions(settings, topic)]
    channel = settings.topics.channel_operations
    try:
        tps += [TopicPartition(channel, p) for p in await topic_partitions(settings, channel)]
        topic = f"{topic} + {channel}"
    except TopicNotFound:
        log.info("no channel-operation topic %s: rebuilding agent events only", channel)
    replay = _Replay(settings, writer, settings.topics.input, clock)
    # the alerts' watermark waits for every partition of the input (rule 16)
    replay.expect_lanes(_lane(settings, tp) for tp in tps if tp.topic == settings.topics.input)
    consumer = _consumer(settings)
    started = time.monotonic()
    await consumer.start()
    try:
        begin = await consumer.beginning_offsets(tps)
        end = await consumer.end_offsets(tps)  # the stop line, fixed now
        summary = RebuildSummary(
            database, topic, {_lane(settings, tp): (begin[tp], end[tp]) for tp in tps}
        )
        log.info(
            "rebuilding %s into %s: %d offsets over %d partitions",
            topic,
            database,
            summary.total,
            len(tps),
        )
        consumer.assign(tps)
        active = [tp for tp in tps if end[tp] > begin[tp]]
        for tp in tps:
            if tp in active:
                consumer.seek(tp, begin[tp])
            else:
                consumer.pause(tp)
        await _consume(consumer, active, begin, end, replay, summary, progress, batch_size)
    finally:
        await consumer.stop()
    replay.finish()
    summary.stats, summary.dead_letters = replay.stats, replay.dead_letters
    replay.tally.fill(summary)  # runs, events, quarantine and alerts as the ledger holds them
    summary.seconds = time.monotonic() - started
    return summary


async def _consume(
    consumer: Any,
    active: list[TopicPartition],
    begin: dict[TopicPartition, int],
    end: dict[TopicPartition, int],
    replay: _Replay,
    summary: RebuildSummary,
    progress: bool,
    batch_size: int,
) -> None:
    from tqdm import tqdm

    position = dict(begin)
    with tqdm(
        total=summary.total,
        unit="rec",
        desc=f"rebuild {summary.database}",
        file=sys.stderr,
        disable=not progress,
    ) as bar:
        while active:
            batch = await consumer.getmany(*active, timeout_ms=_POLL_MS, max_records=batch_size)
            for tp, records in sorted(batch.items()):
                records = [r for r in records if r.offset < end[tp]]
                if records:
                    behind = records[-1].offset + 1 < end[tp]
                    replay.partition_batch(_lane(replay.settings, tp), records, behind=behind)
                    summary.records += len(records)
            for tp in list(active):
                pos = min(await consumer.position(tp), end[tp])
                bar.update(pos - position[tp])
                position[tp] = pos
                if pos >= end[tp]:
                    consumer.pause(tp)
                    active.remove(tp)


class _Replay:
    """The worker's steps without topics: the intake step per partition, alerts, the ledger."""

    def __init__(
        self, settings: Settings, writer: Any, topic: str, clock: Callable[[], float]
    ) -> None:
        config = settings.core_config()
        alerter = ExhaustionAlerter(
            config.alert_window_s, config.alert_threshold, config.lateness_s
        )
        self.settings = settings
        self.intake = Intake(config, max_event_bytes=settings.max_event_bytes, alerter=alerter)
        self.store = LedgerStore(writer)
        self.topic = topic
        self.clock = clock
        self.last_offset: dict[int, int] = {}
        self.stats: Counter[str] = Counter()
        self.tally = LedgerTally()  # the rows folded as the ledger folds them
        self.dead_letters = 0

    def partition_batch(
        self, partition: int, records: Sequence[Any], *, behind: bool = False
    ) -> None:
        """Step and store one lane's records; ``behind``: more of it still to read."""
        self.intake.clock.behind(partition, behind)
        recs: list[InRecord] = [in_record(r) for r in records]
        out = store_isolating(self.intake, {partition: recs}, self.clock(), self.store)
        self.last_offset[partition] = records[-1].offset
        self._count(out)

    def expect_lanes(self, lanes: Iterable[int]) -> None:
        """The lanes the alerts' watermark waits for before it decides anything."""
        assert self.intake.alerter is not None
        self.intake.alerter.expect(list(lanes))

    def finish(self) -> None:
        """Close what waited on a grace period, as the live worker's timer does; the topic's
        end is the end of input for the alerts, as a quiet stream is for the worker's."""
        outs = self.intake.tick(self.clock() + self.intake.config.grace_period_s)
        out = Output()
        for partition, part in outs.items():
            out.extend(part)
            offset = self.last_offset[partition]
            out.ranges.append(("tick:" + self.topic, partition, offset, offset))
        out.extend(self.intake.settle_alerts())
        self.store(out)
        self.intake.commit(outs)
        self._count(out)

    def _count(self, out: Output) -> None:
        self.stats.update(out.stats)
        self.tally.add(out.ledger)
        self.dead_letters += len(out.ledger.dead_letters)


def _lane(settings: Settings, tp: TopicPartition) -> int:
    lane = lane_of(settings.topics, tp.topic, tp.partition)
    assert lane is not None, tp
    return lane


def _runs_in(client: Any, database: str) -> int:
    """Runs already stored in ``database`` (0 when it or its tables do not exist yet)."""
    exists = client.query(
        "SELECT count() FROM system.tables WHERE database = {db:String} AND name = 'runs_store'",
        parameters={"db": database},
    ).result_rows[0][0]
    if not exists:
        return 0
    # Distinct runs: the store keeps one row per version of a run until it merges.
    sql = f"SELECT uniqExact(run_id) FROM {database}.runs_store"
    return int(client.query(sql).result_rows[0][0])
