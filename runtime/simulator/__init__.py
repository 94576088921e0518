"""A realistic, deterministic Prism fleet simulator with a ground-truth manifest.

``simulate(FleetConfig(...))`` returns a ``Fleet``: the Kafka records in delivery order
(chaos included, each a ``FleetRecord``), the valid envelopes, and ``manifest``: what a
correct pipeline must conclude from those records. Write it with ``write_jsonl`` /
``write_manifest`` or produce it with ``publish_to_kafka``. The same seed always gives
the same bytes (except ``clock="wall"``, which moves event time to end near now).

Manifest (a JSON-ready dict; rules in ``runtime/simulator/_manifest.py``):

- ``params``: seed, runs, knobs, stale_after_seconds, max_event_bytes, start, clock
- ``watermark``: the latest ``ts`` of any valid record
- ``counts``: records, valid_records, duplicates, unique_events, applied_events
- ``runs[run_id]``: tenant_id, provider, model, parent_run_id, status, terminal_type,
  stop_reason, failure_class, model_turns, deterministic_turns, cache_hit_rate,
  exhaustion, missing_seqs, usage_mismatch, last_event_at
- ``tenants[tenant_id]``: ``billable`` (reported provider_turn rows: tokens, rows,
  ``cost`` per currency as decimal strings) and ``estimated`` (unsuperseded estimates:
  tokens, rows, ``by_confidence``); ``by_model``: the same per tenant/provider/model/currency
- ``dlq``: unparsable / contract_violation / oversized record counts;
  ``quarantine``: post_terminal / conflicting_terminal distinct event counts

With ``runs >= COVERAGE_MIN_RUNS`` every scenario is generated at least once; every
chaos knob above zero happens at least once.

Example::

    from prism.runtime.simulator import FleetConfig, simulate, write_jsonl, write_manifest

    fleet = simulate(FleetConfig(runs=1000, seed=7, duplicates=0.02, reorder_window=3))
    write_jsonl(fleet, "fleet.jsonl")
    write_manifest(fleet, "manifest.json")
"""

from ._chaos import RECORD_KINDS, FleetRecord
from ._config import (
    DEFAULT_START,
    FLEET_SPAN,
    FleetConfig,
    SimulatorConfigError,
    SimulatorError,
    SimulatorPublishError,
)
from ._fleet import Fleet, simulate
from ._io import write_jsonl, write_manifest
from ._kafka import PublishReport, publish_to_kafka
from ._scenarios import COVERAGE_MIN_RUNS

__all__ = [
    "COVERAGE_MIN_RUNS",
    "DEFAULT_START",
    "FLEET_SPAN",
    "RECORD_KINDS",
    "Fleet",
    "FleetConfig",
    "FleetRecord",
    "PublishReport",
    "SimulatorConfigError",
    "SimulatorError",
    "SimulatorPublishError",
    "publish_to_kafka",
    "simulate",
    "write_jsonl",
    "write_manifest",
]
