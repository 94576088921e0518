"""Each provisioned alert rule, replayed as Grafana evaluates it, fires on a bad fleet only.

Two small simulated fleets are ingested into chDB ledgers with an ingest clock that walks
along the fleet's event time, so ``received_at`` moves as it would live. The *good* ledger
is a healthy fleet with the usual noise (a few dead letters, stale runs and limit deaths).
The *bad* ledger is that fleet with a bad runtime release half-way: a burst of limit
deaths, runs that stop before their terminal, and junk records arriving in one burst. Each rule is
evaluated every 5 minutes of the replay as Grafana would (its query over its relative time
range ending at that minute, expanded by ``expand_alert_query``, reduced to the last value
per series, compared with its threshold, held for its ``for``, no rows = its no-data state).
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest

from prism.dashboards import AlertThresholds, TimeRange, alerting_files, expand_alert_query
from prism.pipeline._store import LedgerStore
from prism.pipeline.ingest import ingest_lines
from prism.runtime.simulator import FLEET_SPAN, FleetConfig, simulate
from prism.sinks import LedgerWriter, migrate

pytestmark = pytest.mark.integration

STEP = timedelta(minutes=5)
GOOD = FleetConfig(runs=80, seed=31, malformed=0.05, duplicates=0.02, reorder_window=2)
# The same fleet with a bad runtime release: a limit-death burst, runs that stop sending
# their terminal after RELEASE_AT, and junk that arrives all at once at the end.
BAD = dataclasses.replace(GOOD, malformed=0.3, limit_death_burst=25)
RELEASE_AT = timedelta(hours=1, minutes=30)
TERMINALS = {"agent_finished", "agent_denied", "error"}
BATCH = 100


def _rules(database: str) -> dict[str, dict[str, Any]]:
    files = alerting_files(AlertThresholds(), database)
    return {r["uid"]: r for r in files["alert-rules.yaml"]["groups"][0]["rules"]}


def _seconds(duration: str) -> int:
    units = {"s": 1, "m": 60, "h": 3600}
    return int(duration[:-1]) * units[duration[-1]] if duration != "0s" else 0


@dataclass
class Ledger:
    client: Any
    database: str
    start: datetime  # the fleet's event-time origin
    end: datetime  # the last ingest clock tick

    def state(self, rule: dict[str, Any], now: datetime) -> str:
        """One evaluation: Alerting (condition true), Normal, or the rule's no-data state."""
        query, _reduce, threshold = rule["data"]
        window = timedelta(seconds=query["relativeTimeRange"]["from"])
        sql = expand_alert_query(query["model"]["rawSql"], TimeRange(now - window, now))
        result = self.client.query(sql)
        values = [
            float(row[-1])
            for row in result.result_rows
            if row[-1] is not None and row[-1] == row[-1]  # dropNN: drop null and NaN
        ]
        if not values:
            return {"OK": "Normal"}.get(rule["noDataState"], rule["noDataState"])
        limit = threshold["model"]["conditions"][0]["evaluator"]["params"][0]
        return "Alerting" if max(values) > limit else "Normal"

    def fires(self, rule: dict[str, Any], until: datetime) -> list[datetime]:
        """The evaluation times at which the rule is firing (condition held for its ``for``)."""
        hold = timedelta(seconds=_seconds(rule["for"]))
        pending_since: datetime | None = None
        firing = []
        now = self.start + STEP
        while now <= until:
            if self.state(rule, now) == "Alerting":
                pending_since = pending_since or now
                if now - pending_since >= hold:
                    firing.append(now)
            else:
                pending_since = None
            now += STEP
        return firing


def _walking_clock(start: datetime, end: datetime, batches: int) -> Any:
    """An ingest clock that moves from ``start`` to ``end`` over ``batches`` calls."""
    ticks = iter(start + (end - start) * i / max(batches - 1, 1) for i in range(batches))
    return lambda: next(ticks, end).timestamp()


def _bad_release(records: list[Any], start: datetime) -> list[bytes]:
    """Terminals after the release are never sent; the junk arrives last, in one burst."""
    valid, junk = [], []
    for record in records:
        if record.kind != "valid":
            junk.append(record.value)
            continue
        event = json.loads(record.value)
        at = datetime.fromisoformat(event["ts"])
        if event["type"] in TERMINALS and at >= start + RELEASE_AT:
            continue
        valid.append(record.value)
    return valid + junk


def _ledger(client: Any, bad: bool) -> Iterator[Ledger]:
    database = f"t_alerts_{uuid.uuid4().hex[:10]}"
    client.command(f"CREATE DATABASE {database}")
    try:
        migrate(client, database, raw_event_ttl_days=3650)
        config = BAD if bad else GOOD
        start, end = config.resolved_start, config.resolved_start + FLEET_SPAN
        records = simulate(config).records
        lines = _bad_release(records, start) if bad else [r.value for r in records]
        ingest_lines(
            iter(lines),
            source="file:fleet.jsonl",
            store=LedgerStore(LedgerWriter(client, database)),
            batch_size=BATCH,
            clock=_walking_clock(start, end, -(-len(lines) // BATCH) + 1),
        )
        yield Ledger(client, database, start, end)
    finally:
        client.command(f"DROP DATABASE IF EXISTS {database} SYNC")


@pytest.fixture(scope="module")
def good(ch_client: Any) -> Iterator[Ledger]:
    yield from _ledger(ch_client, bad=False)


@pytest.fixture(scope="module")
def bad(ch_client: Any) -> Iterator[Ledger]:
    yield from _ledger(ch_client, bad=True)


@pytest.mark.parametrize(
    "uid",
    ["prism-limit-exhaustion-rate", "prism-dead-letter-rate", "prism-stale-run-growth"],
)
def test_rate_rules_fire_on_the_bad_release_and_stay_quiet_on_the_healthy_fleet(
    good: Ledger, bad: Ledger, uid: str
) -> None:
    # The healthy fleet has dead letters, stale runs and limit deaths: none of them pages.
    noise = good.client.query(
        f"""
        SELECT (SELECT count() FROM {good.database}.dead_letters),
               (SELECT count() FROM {good.database}.runs WHERE status = 'incomplete'),
               (SELECT count() FROM {good.database}.runs WHERE exhaustion_limit IS NOT NULL)
        """
    ).result_rows[0]
    assert all(n > 0 for n in noise), noise
    assert good.fires(_rules(good.database)[uid], good.end + STEP) == []
    fired = bad.fires(_rules(bad.database)[uid], bad.end + STEP)
    assert fired, f"{uid} never fired on the bad release"
    assert min(fired) >= bad.start + RELEASE_AT, f"{uid} fired before the release: {fired}"


def test_freshness_fires_when_open_runs_stop_receiving_events(good: Ledger) -> None:
    rule = _rules(good.database)["prism-ingest-freshness"]
    # While the fleet flows, never; once the ledger stops receiving while runs are open, yes.
    assert good.fires(rule, good.end) == []
    stalled = good.end + timedelta(minutes=30)
    assert good.state(rule, stalled) == "Alerting"
    [(open_runs,)] = good.client.query(
        f"SELECT count() FROM {good.database}.runs WHERE status = 'running'"
    ).result_rows
    assert open_runs > 0


def test_freshness_is_nodata_when_events_are_expected_and_ok_when_none_are(good: Ledger) -> None:
    rule = _rules(good.database)["prism-ingest-freshness"]
    assert rule["noDataState"] == "NoData"
    # Open runs active within a day, but no event in the last hour: no measurement.
    assert good.state(rule, good.end + timedelta(hours=2)) == "NoData"
    # No run active within a day is open: no event is expected, so silence is fine.
    assert good.state(rule, good.end + timedelta(hours=25)) == "Normal"
