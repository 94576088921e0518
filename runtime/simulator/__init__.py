"""A realistic, deterministic Prism fleet simulator with a ground-truth manifest.

``simulate(FleetConfig(...))`` returns a ``Fleet``: the Kafka records in delivery order
(chaos included, each a ``FleetRecord``; ``family`` says whether it belongs on
``prism.agent-events`` or ``prism.channel-operations``), the valid envelopes, and
``manifest``: what a correct pipeline must conclude from those records, computed from the
records alone with rules written here, never with pipeline code. Write it with
``write_jsonl`` / ``write_manifest`` or produce it with ``publish_to_kafka``. The same
seed always gives the same bytes (except ``clock="wall"``, which moves event time to end
near now). Knobs that are off leave a fleet byte-identical to one made without them.

Manifest (a JSON-ready dict; rules in ``_manifest``, ``_truth``, ``_billing``,
``_expected_alerts`` and ``_channel_truth``):

- ``params``: seed, runs, knobs, stale_after_seconds, max_event_bytes, start, clock,
  processing_clock (the pipeline clock the truth assumes), max_clock_skew_seconds,
  partitions, alert_window_seconds, alert_threshold, channel_stuck_seconds
- ``watermark``: the latest ``ts`` of any valid record not stamped beyond processing_clock + skew
- ``counts``: records, valid_records, duplicates (same eventId again), unique_events,
  applied_events, quarantined_events; ``runs_by_status``
- ``runs[run_id]``: tenant_id (the owner), account_id, user_id, provider, model,
  parent_run_id, status, terminal_type, stop_reason, failure_class, model_turns,
  deterministic_turns, cache_hit_rate, exhaustion, missing_seqs, usage_mismatch,
  clock_skew, guardrail_denials, quarantined_events, last_event_at
- ``tenants[tenant_id]``: ``billable`` (accepted reported provider_turn rows: tokens, rows,
  ``cost`` per currency as decimal strings) and ``estimated`` (unsuperseded estimates:
  tokens, rows, ``by_confidence``); ``by_model``: the same per tenant/provider/model/currency;
  ``by_agent_month``: reported rows, tokens and cost per agent, UTC month and currency;
  ``estimates.by_confidence``: rows and tokens per confidence over the fleet
- ``dlq``: unparsable / contract_violation / oversized record counts; ``quarantine``:
  post_terminal / conflicting_terminal / duplicate_seq / tenant_mismatch / duplicate_usage
  distinct event counts; ``quarantined_events``: eventId -> reason
- ``guardrails``: denials, by_pack, by_rule, by_stage
- ``alerts``: ``run_limit_exhaustion`` firings (tenant, axis, fired_at, alert_id, runs) and
  ``stale_run`` (the incomplete runs)
- ``channels`` (with ``channel_operations``; else null): counts, operations_by_state,
  open_items, stuck, denials by reason and by connection, quarantine
  (illegal_transition, duplicate_seq), quarantined_events, operations
- ``injected``: what the generator did (hostile runs and their kind, the quiet partition,
  the burst's runs); informative only, no figure above is derived from it

With ``runs >= COVERAGE_MIN_RUNS`` every scenario is generated at least once; every
chaos knob above zero happens at least once (where a run fits it).

Example::

    from prism.runtime.simulator import FleetConfig, simulate, write_jsonl, write_manifest

    fleet = simulate(FleetConfig(runs=1000, seed=7, duplicates=0.02, reorder_window=3,
                                 hostile=0.02, limit_death_burst=6, channel_operations=300))
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
from ._hostile import HOSTILE_KINDS, partition_of
from ._io import write_jsonl, write_manifest
from ._kafka import PublishReport, publish_to_kafka
from ._scenarios import COVERAGE_MIN_RUNS

__all__ = [
    "COVERAGE_MIN_RUNS",
    "DEFAULT_START",
    "FLEET_SPAN",
    "HOSTILE_KINDS",
    "RECORD_KINDS",
    "Fleet",
    "FleetConfig",
    "FleetRecord",
    "PublishReport",
    "SimulatorConfigError",
    "SimulatorError",
    "SimulatorPublishError",
    "partition_of",
    "publish_to_kafka",
    "simulate",
    "write_jsonl",
    "write_manifest",
]
