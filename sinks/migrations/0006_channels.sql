-- Messaging-channel operations (schemas/CONTRACT.md, "Channel operations") and guardrail
-- denials. The channel semantics of the core write versioned rows like the run semantics:
-- the highest version of a key wins, and retracted rows leave the views.

-- One row per operation, its latest state; the version grows with the records it has seen.
CREATE TABLE IF NOT EXISTS ${db}.channel_operations_store ${on_cluster}
(
    operation_id String,
    connection_id LowCardinality(String),
    tenant_id LowCardinality(Nullable(String)),
    kind LowCardinality(String),
    state LowCardinality(Nullable(String)),
    reason Nullable(String),
    run_id Nullable(String),
    session_id Nullable(String),
    agent_id LowCardinality(Nullable(String)),
    first_ts DateTime64(3, 'UTC'),
    last_ts DateTime64(3, 'UTC'),
    since DateTime64(3, 'UTC'),
    admitted_at Nullable(DateTime64(3, 'UTC')),
    delivered_at Nullable(DateTime64(3, 'UTC')),
    stuck Bool,
    transitions UInt32,
    version UInt64
)
ENGINE = ${engine:version}
ORDER BY operation_id
SETTINGS ${dedup_window};

-- Each accepted denied admission (with or without an operation id), keyed by its event id.
CREATE TABLE IF NOT EXISTS ${db}.channel_denials_store ${on_cluster}
(
    event_id String,
    operation_id Nullable(String),
    ts DateTime64(3, 'UTC'),
    connection_id LowCardinality(String),
    tenant_id LowCardinality(Nullable(String)),
    kind LowCardinality(String),
    reason LowCardinality(String),
    version UInt64,
    retracted Bool
)
ENGINE = ${engine:version}
PARTITION BY toYYYYMM(ts)
ORDER BY (toDate(ts), connection_id, event_id)
SETTINGS ${dedup_window};

-- Valid channel records the operation semantics rejected (illegal_transition, duplicate_seq).
CREATE TABLE IF NOT EXISTS ${db}.channel_quarantine_store ${on_cluster}
(
    event_id String,
    operation_id String,
    seq Int64,
    state LowCardinality(String),
    ts DateTime64(3, 'UTC'),
    connection_id LowCardinality(String),
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
ORDER BY (operation_id, event_id)
SETTINGS ${dedup_window};

-- The pipeline's event-time watermark as the channel semantics saw it (version: the
-- watermark in microseconds, so the highest wins): open items age in event time.
CREATE TABLE IF NOT EXISTS ${db}.channel_watermark_store ${on_cluster}
(
    key String,
    watermark DateTime64(3, 'UTC'),
    version UInt64
)
ENGINE = ${engine:version}
ORDER BY key
SETTINGS ${dedup_window};

CREATE OR REPLACE VIEW ${db}.channel_operations ${on_cluster} AS
SELECT * EXCEPT (version) FROM ${db}.channel_operations_store FINAL;

-- Open items for on-call: the send threw or the process died, and no host reconciled yet.
-- age_seconds is measured at the pipeline's event-time watermark.
CREATE OR REPLACE VIEW ${db}.channel_open_items ${on_cluster} AS
SELECT
    o.operation_id AS operation_id,
    o.connection_id AS connection_id,
    o.tenant_id AS tenant_id,
    o.state AS state,
    o.since AS since,
    round(
        (toUnixTimestamp64Milli(greatest(w.watermark, o.since))
            - toUnixTimestamp64Milli(o.since)) / 1000,
        3
    ) AS age_seconds
FROM ${db}.channel_operations_store AS o FINAL
CROSS JOIN (SELECT max(watermark) AS watermark FROM ${db}.channel_watermark_store) AS w
WHERE o.state IN ('delivery_unknown', 'execution_unknown');

-- Admission denials per minute, connection, tenant and reason (capacity is an SRE signal).
CREATE OR REPLACE VIEW ${db}.channel_denials ${on_cluster} AS
SELECT
    toStartOfMinute(ts) AS minute,
    connection_id,
    ifNull(tenant_id, '') AS tenant_id,
    reason,
    count() AS count
FROM ${db}.channel_denials_store FINAL
WHERE NOT retracted
GROUP BY minute, connection_id, tenant_id, reason
SETTINGS do_not_merge_across_partitions_select_final = 1;

CREATE OR REPLACE VIEW ${db}.channel_quarantine ${on_cluster} AS
SELECT * EXCEPT (version, retracted) FROM ${db}.channel_quarantine_store FINAL
WHERE NOT retracted;

-- Guardrail-pack denials of runs (rule `pack:<pack>/<rule>`, never the denied content).
CREATE OR REPLACE VIEW ${db}.guardrail_denials ${on_cluster} AS
SELECT
    ts,
    run_id,
    tenant_id,
    extract(JSONExtractString(payload, 'rule'), '^pack:([^/]+)/') AS pack,
    JSONExtractString(payload, 'rule') AS rule,
    JSONExtractString(payload, 'stage') AS stage,
    if(JSONHas(payload, 'tool'), JSONExtractString(payload, 'tool'), NULL) AS tool,
    if(JSONHas(payload, 'turn'), JSONExtractUInt(payload, 'turn'), NULL) AS turn,
    event_id
FROM ${db}.run_events
WHERE type = 'guardrail_denied';
