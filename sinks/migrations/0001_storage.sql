-- Storage tables of the ledger. Users query the views of 0002_views.sql, not these.
--
-- Placeholders (filled by sinks._migrate): ${db} database, ${on_cluster} "ON CLUSTER c" or
-- nothing, ${engine} / ${engine:version} the (Replicated)ReplacingMergeTree engine with an
-- optional version column, ${dedup_window} the insert-deduplication window setting,
-- ${raw_event_ttl_days} the raw event retention in days.
--
-- ReplacingMergeTree only collapses rows of one partition. Every partition key below is a
-- function of a column that never changes for a given sorting key (or there is none), so
-- the views may read with FINAL per partition; turns_store is the exception (a turn's ts
-- could in principle move), so its view collapses across partitions. Tables read one run
-- at a time (runs, turns, raw events) use small granules: a lookup reads fewer rows.

-- One record per run, updated as the run progresses: the highest version wins. Runs carry
-- no time that is fixed from the first event on (started_at may arrive late), so the
-- table is not partitioned.
CREATE TABLE IF NOT EXISTS ${db}.runs_store ${on_cluster}
(
    run_id String,
    tenant_id LowCardinality(Nullable(String)),
    account_id Nullable(String),
    user_id Nullable(String),
    session_id Nullable(String),
    agent_id LowCardinality(Nullable(String)),
    agent_definition_revision Nullable(String),
    provider LowCardinality(Nullable(String)),
    model LowCardinality(Nullable(String)),
    parent_run_id Nullable(String),
    delegation_id Nullable(String),
    child_id Nullable(String),
    bundle_digest Nullable(String),
    status LowCardinality(String),
    terminal_type LowCardinality(Nullable(String)),
    terminal_seq Nullable(Int64),
    started_at Nullable(DateTime64(3, 'UTC')),
    finished_at Nullable(DateTime64(3, 'UTC')),
    last_event_at DateTime64(3, 'UTC'),
    stop_reason LowCardinality(Nullable(String)),
    stop_detail Nullable(String),
    finish_reason Nullable(String),
    error_code LowCardinality(Nullable(String)),
    error_message Nullable(String),
    failure_class LowCardinality(Nullable(String)),
    abort_reason Nullable(String),
    denied_reason Nullable(String),
    model_turns UInt32,
    deterministic_turns UInt32,
    tool_calls UInt32,
    cache_hit_rate Nullable(Float64),
    exhaustion_limit LowCardinality(Nullable(String)),
    exhaustion_maximum Nullable(Float64),
    exhaustion_observed Nullable(Float64),
    exhaustion_axis LowCardinality(Nullable(String)),
    exhaustion_closest Nullable(String),
    missing_seqs Array(Int64),
    usage_mismatch Bool,
    event_count UInt32,
    max_seq Int64,
    closed Bool,
    timeline String CODEC(ZSTD(3)),
    version UInt64,
    INDEX idx_last_event_at last_event_at TYPE minmax GRANULARITY 4
)
ENGINE = ${engine:version}
ORDER BY run_id
SETTINGS ${dedup_window}, index_granularity = 1024;

-- One row per model or deterministic turn; a turn is updated when its usage arrives.
CREATE TABLE IF NOT EXISTS ${db}.turns_store ${on_cluster}
(
    run_id String,
    kind LowCardinality(String),
    turn UInt32,
    attempt UInt32,
    tenant_id LowCardinality(Nullable(String)),
    provider LowCardinality(Nullable(String)),
    model LowCardinality(Nullable(String)),
    seq Int64,
    ts DateTime64(3, 'UTC'),
    stop_reason LowCardinality(Nullable(String)),
    latency_ms Nullable(Float64),
    middleware LowCardinality(Nullable(String)),
    tools_count Nullable(UInt32),
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
    version UInt64
)
ENGINE = ${engine:version}
PARTITION BY toYYYYMM(ts)
ORDER BY (run_id, kind, turn, attempt)
SETTINGS ${dedup_window}, index_granularity = 1024;

-- One row per usage_recorded event: the billing source. Append-only, keyed on event_id: the
-- tenant, time and run before it in the key are fixed per event. Leading with tenant and
-- day makes one tenant's billing period one key range, and parts written later never
-- overlap older ones, which keeps FINAL cheap. A run's rows are found by the bloom filter.
-- Kept forever: no TTL.
CREATE TABLE IF NOT EXISTS ${db}.usage_store ${on_cluster}
(
    event_id String,
    run_id String,
    seq Int64,
    tenant_id LowCardinality(Nullable(String)),
    account_id Nullable(String),
    provider LowCardinality(Nullable(String)),
    model LowCardinality(Nullable(String)),
    scope LowCardinality(String),
    turn Nullable(UInt32),
    attempt Nullable(UInt32),
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
    version UInt32,
    INDEX idx_run_id run_id TYPE bloom_filter(0.001) GRANULARITY 1
)
ENGINE = ${engine:version}
PARTITION BY toYYYYMM(recorded_at)
ORDER BY (tenant_id, toDate(recorded_at), run_id, event_id)
SETTINGS ${dedup_window}, allow_nullable_key = 1;

-- The raw log of accepted events, for replay and audits; expires after the raw event TTL.
CREATE TABLE IF NOT EXISTS ${db}.run_events_store ${on_cluster}
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
    received_at DateTime64(3, 'UTC')
)
ENGINE = ${engine}
PARTITION BY toYYYYMM(ts)
ORDER BY (run_id, seq, event_id)
TTL toDateTime(ts) + INTERVAL ${raw_event_ttl_days} DAY
SETTINGS ${dedup_window}, ttl_only_drop_parts = 1, index_granularity = 1024;

-- Per-minute cache totals per source partition; version = turns counted so far.
CREATE TABLE IF NOT EXISTS ${db}.cache_minute_store ${on_cluster}
(
    minute DateTime64(3, 'UTC'),
    tenant_id LowCardinality(String),
    provider LowCardinality(String),
    model LowCardinality(String),
    partition Int32,
    turns UInt64,
    turns_reporting_cache UInt64,
    turns_not_reporting_cache UInt64,
    input_tokens UInt64,
    input_tokens_reporting_cache UInt64,
    cache_read_tokens UInt64,
    cache_write_tokens UInt64,
    version UInt64
)
ENGINE = ${engine:version}
PARTITION BY toYYYYMM(minute)
ORDER BY (minute, tenant_id, provider, model, partition)
SETTINGS ${dedup_window};

-- Valid events rejected by run semantics (post_terminal, conflicting_terminal).
CREATE TABLE IF NOT EXISTS ${db}.quarantine_store ${on_cluster}
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
    received_at DateTime64(3, 'UTC')
)
ENGINE = ${engine}
PARTITION BY toYYYYMM(ts)
ORDER BY event_id
SETTINGS ${dedup_window};

-- Records that could not be parsed or violate the contract, keyed on their source position.
-- Not partitioned: a re-delivered record gets a new received_at.
CREATE TABLE IF NOT EXISTS ${db}.dead_letters_store ${on_cluster}
(
    source LowCardinality(String),
    partition Int32,
    offset Int64,
    code LowCardinality(String),
    reason String,
    raw String CODEC(ZSTD(3)),
    received_at DateTime64(3, 'UTC')
)
ENGINE = ${engine}
ORDER BY (source, partition, offset)
SETTINGS ${dedup_window};

-- Alerts raised and resolved; alert_id is rule + key + window start. Keyed on (alert_id, state)
-- so the firing row survives its resolve.
CREATE TABLE IF NOT EXISTS ${db}.alerts_store ${on_cluster}
(
    alert_id String,
    rule LowCardinality(String),
    state LowCardinality(String),
    tenant_id LowCardinality(Nullable(String)),
    key String,
    value Float64,
    threshold Float64,
    window_start DateTime64(3, 'UTC'),
    window_end DateTime64(3, 'UTC'),
    ts DateTime64(3, 'UTC'),
    message String,
    version UInt64
)
ENGINE = ${engine:version}
PARTITION BY toYYYYMM(window_start)
ORDER BY (alert_id, state)
SETTINGS ${dedup_window};
