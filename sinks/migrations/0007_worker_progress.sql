-- Each worker's position per source partition, sampled every PRISM_PROGRESS_INTERVAL_SECONDS:
-- the dashboards chart consumer lag from here like every other figure. Samples are facts of
-- a moment (append-only; a repeated insert of the same sample collapses on the key) and
-- expire after 30 days.
CREATE TABLE IF NOT EXISTS ${db}.worker_progress_store ${on_cluster}
(
    ts DateTime64(3, 'UTC'),
    worker LowCardinality(String),
    source LowCardinality(String),
    partition Int32,
    processed Int64,
    end_offset Int64,
    lag Int64,
    last_batch_at Nullable(DateTime64(3, 'UTC'))
)
ENGINE = ${engine}
PARTITION BY toYYYYMM(ts)
ORDER BY (source, partition, worker, ts)
TTL toDateTime(ts) + INTERVAL 30 DAY
SETTINGS ${dedup_window}, ttl_only_drop_parts = 1;

CREATE OR REPLACE VIEW ${db}.worker_progress ${on_cluster} AS
SELECT ts, worker, source, partition, processed, end_offset, lag, last_batch_at
FROM ${db}.worker_progress_store FINAL;
