-- Ledger v2 (schemas/CONTRACT.md rules 10-15). Rows that can be re-stated carry a version
-- and a `retracted` flag, and the views drop retracted rows: an event found to be
-- post-terminal (or a duplicate usage, or another tenant's) after its rows were written
-- leaves every view, billing included, without any mutation. usage_store is keyed on
-- stable ids only, so a tenant learned late re-states a row under the same key. Gaps are
-- stored as ranges. Turn and attempt numbers widen to 64 bits (rule 13 bounds them at
-- 2^53-1). The per-minute cache table gives way to a view over turns, so a retracted turn
-- leaves the aggregate too. The raw event TTL counts from arrival (received_at): an event
-- time near the end of DateTime's range can no longer expire a row at once.
--
-- Tables whose key or engine changes are rebuilt: create `<t>_v2`, copy, exchange, drop.

-- runs_store: gaps as ranges with a total count; the clock_skew flag.
ALTER TABLE ${db}.runs_store ${on_cluster}
    ADD COLUMN IF NOT EXISTS missing_ranges Array(Tuple(UInt64, UInt64)) AFTER missing_seqs,
    ADD COLUMN IF NOT EXISTS missing_count UInt64 AFTER missing_ranges,
    ADD COLUMN IF NOT EXISTS clock_skew Bool AFTER usage_mismatch;
ALTER TABLE ${db}.runs_store ${on_cluster} DROP COLUMN IF EXISTS missing_seqs;

-- usage_store: keyed on (day, run, event), versioned, retractable.
CREATE TABLE IF NOT EXISTS ${db}.usage_store_v2 ${on_cluster}
(
    event_id String,
    run_id String,
    seq Int64,
    tenant_id LowCardinality(Nullable(String)),
    account_id Nullable(String),
    provider LowCardinality(Nullable(String)),
    model LowCardinality(Nullable(String)),
    scope LowCardinality(String),
    turn Nullable(UInt64),
    attempt Nullable(UInt64),
    entry_id Nullable(String),
    input_tokens Nullable(Int64),
    output_tokens Nullable(Int64),
    total_tokens Nullable(Int64),
    cache_read_tokens Nullable(Int64),
    cache_write_tokens Nullable(Int64),
    cost Nullable(Decimal(38, 12)),
    currency LowCardinality(Nullable(String)),
    estimated Bool,
    confidence LowCardinality(Nullable(String)),
    recorded_at DateTime64(3, 'UTC'),
    superseded Bool,
    version UInt64,
    retracted Bool,
    INDEX idx_run_id run_id TYPE bloom_filter(0.001) GRANULARITY 1,
    INDEX idx_tenant_id tenant_id TYPE set(1000) GRANULARITY 4
)
ENGINE = ${engine:version}
PARTITION BY toYYYYMM(recorded_at)
ORDER BY (toDate(recorded_at), run_id, event_id)
SETTINGS ${dedup_window};

INSERT INTO ${db}.usage_store_v2
SELECT event_id, run_id, seq, tenant_id, account_id, provider, model, scope, turn, attempt,
       entry_id, input_tokens, output_tokens, total_tokens, cache_read_tokens,
       cache_write_tokens, cost, currency, estimated, confidence, recorded_at, superseded,
       version, false
FROM ${db}.usage_store;

EXCHANGE TABLES ${db}.usage_store AND ${db}.usage_store_v2 ${on_cluster};
DROP TABLE IF EXISTS ${db}.usage_store_v2 ${on_cluster} SYNC;

-- turns_store: 64-bit turn numbers, retractable.
CREATE TABLE IF NOT EXISTS ${db}.turns_store_v2 ${on_cluster}
(
    run_id String,
    kind LowCardinality(String),
    turn UInt64,
    attempt UInt64,
    tenant_id LowCardinality(Nullable(String)),
    provider LowCardinality(Nullable(String)),
    model LowCardinality(Nullable(String)),
    seq Int64,
    ts DateTime64(3, 'UTC'),
    stop_reason LowCardinality(Nullable(String)),
    latency_ms Nullable(Float64),
    middleware LowCardinality(Nullable(String)),
    tools_count Nullable(UInt64),
    tools_ids_hash Nullable(String),
    input_tokens Nullable(Int64),
    output_tokens Nullable(Int64),
    total_tokens Nullable(Int64),
    cache_read_tokens Nullable(Int64),
    cache_write_tokens Nullable(Int64),
    cache_hit_rate Nullable(Float64),
    usage_source LowCardinality(Nullable(String)),
    usage_confidence LowCardinality(Nullable(String)),
    input_cap Nullable(Int64),
    run_input_budget Nullable(Int64),
    run_input_used Nullable(Int64),
    max_turns Nullable(Int64),
    version UInt64,
    retracted Bool
)
ENGINE = ${engine:version}
ORDER BY (run_id, kind, turn, attempt)
SETTINGS ${dedup_window}, index_granularity = 1024;

INSERT INTO ${db}.turns_store_v2
SELECT *, false FROM ${db}.turns_store;

EXCHANGE TABLES ${db}.turns_store AND ${db}.turns_store_v2 ${on_cluster};
DROP TABLE IF EXISTS ${db}.turns_store_v2 ${on_cluster} SYNC;

-- run_events_store: versioned, retractable, expiring from arrival.
CREATE TABLE IF NOT EXISTS ${db}.run_events_store_v2 ${on_cluster}
(
    event_id String,
    run_id String,
    seq Int64,
    type LowCardinality(String),
    ts DateTime64(3, 'UTC'),
    tenant_id LowCardinality(Nullable(String)),
    account_id Nullable(String),
    user_id Nullable(String),
    session_id Nullable(String),
    agent_id LowCardinality(Nullable(String)),
    provider LowCardinality(Nullable(String)),
    model LowCardinality(Nullable(String)),
    parent_run_id Nullable(String),
    bundle_digest Nullable(String),
    payload String CODEC(ZSTD(3)),
    traceparent Nullable(String),
    source LowCardinality(String),
    partition Int32,
    offset Int64,
    received_at DateTime64(3, 'UTC'),
    version UInt64,
    retracted Bool
)
ENGINE = ${engine:version}
ORDER BY (run_id, seq, event_id)
TTL toDateTime(received_at) + INTERVAL ${raw_event_ttl_days} DAY
SETTINGS ${dedup_window}, index_granularity = 1024;

INSERT INTO ${db}.run_events_store_v2
SELECT *, 1, false FROM ${db}.run_events_store;

EXCHANGE TABLES ${db}.run_events_store AND ${db}.run_events_store_v2 ${on_cluster};
DROP TABLE IF EXISTS ${db}.run_events_store_v2 ${on_cluster} SYNC;

-- quarantine_store: versioned, retractable (an event can leave quarantine when a lower-seq
-- event changes the run's owner).
CREATE TABLE IF NOT EXISTS ${db}.quarantine_store_v2 ${on_cluster}
(
    event_id String,
    run_id String,
    seq Int64,
    type LowCardinality(String),
    ts DateTime64(3, 'UTC'),
    tenant_id LowCardinality(Nullable(String)),
    reason LowCardinality(String),
    payload String CODEC(ZSTD(3)),
    source LowCardinality(String),
    partition Int32,
    offset Int64,
    received_at DateTime64(3, 'UTC'),
    version UInt64,
    retracted Bool
)
ENGINE = ${engine:version}
ORDER BY (run_id, event_id)
SETTINGS ${dedup_window};

INSERT INTO ${db}.quarantine_store_v2
SELECT *, 1, false FROM ${db}.quarantine_store;

EXCHANGE TABLES ${db}.quarantine_store AND ${db}.quarantine_store_v2 ${on_cluster};
DROP TABLE IF EXISTS ${db}.quarantine_store_v2 ${on_cluster} SYNC;

-- The views: current rows, retracted ones left out (a view's columns are fixed when it is
-- created, so every view over a changed table is created again).
CREATE OR REPLACE VIEW ${db}.runs ${on_cluster} AS
SELECT * FROM ${db}.runs_store FINAL;

CREATE OR REPLACE VIEW ${db}.usage ${on_cluster} AS
SELECT * EXCEPT (version, retracted) FROM ${db}.usage_store FINAL
WHERE NOT retracted
SETTINGS do_not_merge_across_partitions_select_final = 1;

CREATE OR REPLACE VIEW ${db}.turns ${on_cluster} AS
SELECT * EXCEPT (retracted) FROM ${db}.turns_store FINAL
WHERE NOT retracted;

CREATE OR REPLACE VIEW ${db}.run_events ${on_cluster} AS
SELECT * EXCEPT (version, retracted) FROM ${db}.run_events_store FINAL
WHERE NOT retracted;

CREATE OR REPLACE VIEW ${db}.quarantine ${on_cluster} AS
SELECT * EXCEPT (version, retracted) FROM ${db}.quarantine_store FINAL
WHERE NOT retracted;

-- Billing's source: provider_turn rows only (rule 5); superseded estimates stay visible
-- here with their flag, and the billing queries skip them.
CREATE OR REPLACE VIEW ${db}.billing_usage ${on_cluster} AS
SELECT * EXCEPT (version, retracted)
FROM ${db}.usage_store FINAL
WHERE scope = 'provider_turn' AND NOT retracted
SETTINGS do_not_merge_across_partitions_select_final = 1;

-- Per-minute cache aggregates over the current model turns. The hit rate is token-weighted:
-- cache reads over the input tokens of the turns that report cache reads; NULL when none do.
CREATE OR REPLACE VIEW ${db}.cache_hits_1m ${on_cluster} AS
SELECT
    toStartOfMinute(t.ts) AS minute,
    ifNull(t.tenant_id, '') AS tenant_id,
    ifNull(t.provider, '') AS provider,
    ifNull(t.model, '') AS model,
    count() AS turns,
    countIf(t.cache_read_tokens IS NOT NULL) AS turns_reporting_cache,
    countIf(t.cache_read_tokens IS NULL) AS turns_not_reporting_cache,
    toUInt64(sum(ifNull(t.input_tokens, 0))) AS input_tokens,
    toUInt64(sumIf(ifNull(t.input_tokens, 0), t.cache_read_tokens IS NOT NULL))
        AS input_tokens_reporting_cache,
    toUInt64(sum(ifNull(t.cache_read_tokens, 0))) AS cache_read_tokens,
    toUInt64(sum(ifNull(t.cache_write_tokens, 0))) AS cache_write_tokens,
    sum(ifNull(t.cache_read_tokens, 0))
        / nullIf(sumIf(ifNull(t.input_tokens, 0), t.cache_read_tokens IS NOT NULL), 0)
        AS cache_hit_rate
FROM ${db}.turns AS t
WHERE t.kind = 'model'
GROUP BY minute, tenant_id, provider, model;

DROP TABLE IF EXISTS ${db}.cache_minute_store ${on_cluster} SYNC;

-- The run-semantics state of file replays (`prism-pipeline ingest-file`), kept beside the
-- ledger it produced, so a backfill split over several invocations equals one file.
CREATE TABLE IF NOT EXISTS ${db}.ingest_state ${on_cluster}
(
    key String,
    value String CODEC(ZSTD(3)),
    version UInt64,
    deleted Bool
)
ENGINE = ${engine:version}
ORDER BY key
SETTINGS ${dedup_window};
