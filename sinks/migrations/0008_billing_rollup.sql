-- Billing's day rollup (sinks/_rollup.py, sinks/BILLING.md "Speed"): for a month of
-- usage_store (one partition), the billing report's own lines per day, tenant, account,
-- provider and model, computed with FINAL like every report, and the exact set of
-- usage_store parts they were computed from. A report uses a month's lines only while
-- that partition still holds the same data: no part with a higher block number or data
-- version (an insert, a retraction, a mutation), and every part it was computed from still
-- covered by an active part (nothing dropped); merges keep it valid, since a
-- ReplacingMergeTree merge never changes what FINAL returns. Otherwise the report reads
-- the rows, as before. Lines and manifest are written by whoever may insert (the billing
-- command, `sinks.refresh_billing_rollup`); a refresh writes its lines, then its manifest,
-- so lines without a manifest are never read. A migration that rebuilds usage_store must
-- clear both tables (a new table's block numbers start again).

CREATE TABLE IF NOT EXISTS ${db}.billing_rollup_store ${on_cluster}
(
    month String,  -- the usage_store partition (toYYYYMM of recorded_at)
    refresh_id String,
    day Date,
    tenant_id LowCardinality(Nullable(String)),
    account_id Nullable(String),
    provider LowCardinality(Nullable(String)),
    model LowCardinality(Nullable(String)),
    kind LowCardinality(String),
    currency LowCardinality(Nullable(String)),
    confidence LowCardinality(Nullable(String)),
    priced_by LowCardinality(String),
    rows UInt64,
    input_tokens Nullable(Int64),
    output_tokens Nullable(Int64),
    total_tokens Nullable(Int64),
    cache_read_tokens Nullable(Int64),
    cache_write_tokens Nullable(Int64),
    cost Nullable(Decimal(38, 12))
)
ENGINE = ${engine}
ORDER BY (refresh_id, day, tenant_id, account_id, provider, model, kind, currency, confidence,
          priced_by)
SETTINGS ${dedup_window}, allow_nullable_key = 1;

-- One row per refresh: the parts (min, max block) of the partition it read, the highest
-- block number or data version among them, the table's uuid, and whether any line is
-- reported usage without a cost (such a month is read from rows while the price book
-- holds prices).
CREATE TABLE IF NOT EXISTS ${db}.billing_rollup_manifest ${on_cluster}
(
    month String,
    refresh_id String,
    table_uuid UUID,
    generation UInt64,
    parts Array(Tuple(UInt64, UInt64)),
    needs_price Bool,
    created_at DateTime64(3, 'UTC')
)
ENGINE = ${engine}
ORDER BY (month, created_at, refresh_id)
SETTINGS ${dedup_window};
