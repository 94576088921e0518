-- The SQL surface users query: one view per name, each returning deduplicated current
-- rows (FINAL collapses the ReplacingMergeTree versions at read time). Where a key never
-- changes partition (see 0001_storage.sql), FINAL merges within each partition only
-- (do_not_merge_across_partitions_select_final), which is cheaper.
-- Placeholders as in 0001_storage.sql.

-- One row per run, its latest version.
CREATE OR REPLACE VIEW ${db}.runs ${on_cluster} AS
SELECT * FROM ${db}.runs_store FINAL;

-- One row per usage_recorded event (provider_turn and run_total scopes).
CREATE OR REPLACE VIEW ${db}.usage ${on_cluster} AS
SELECT * EXCEPT (version) FROM ${db}.usage_store FINAL
SETTINGS do_not_merge_across_partitions_select_final = 1;

-- One row per model or deterministic turn, its latest version.
CREATE OR REPLACE VIEW ${db}.turns ${on_cluster} AS
SELECT * FROM ${db}.turns_store FINAL;

-- The raw event log (envelope columns, payload JSON, source partition/offset).
CREATE OR REPLACE VIEW ${db}.run_events ${on_cluster} AS
SELECT * FROM ${db}.run_events_store FINAL
SETTINGS do_not_merge_across_partitions_select_final = 1;

-- Per-minute cache aggregates over all source partitions. The hit rate is token-weighted:
-- cache reads over the input tokens of the turns that report cache reads; NULL when none do.
CREATE OR REPLACE VIEW ${db}.cache_hits_1m ${on_cluster} AS
SELECT
    c.minute AS minute,
    c.tenant_id AS tenant_id,
    c.provider AS provider,
    c.model AS model,
    sum(c.turns) AS turns,
    sum(c.turns_reporting_cache) AS turns_reporting_cache,
    sum(c.turns_not_reporting_cache) AS turns_not_reporting_cache,
    sum(c.input_tokens) AS input_tokens,
    sum(c.input_tokens_reporting_cache) AS input_tokens_reporting_cache,
    sum(c.cache_read_tokens) AS cache_read_tokens,
    sum(c.cache_write_tokens) AS cache_write_tokens,
    sum(c.cache_read_tokens) / nullIf(sum(c.input_tokens_reporting_cache), 0) AS cache_hit_rate
FROM ${db}.cache_minute_store AS c FINAL
GROUP BY c.minute, c.tenant_id, c.provider, c.model
SETTINGS do_not_merge_across_partitions_select_final = 1;

-- Valid events rejected by run semantics, with the reason and the raw envelope.
CREATE OR REPLACE VIEW ${db}.quarantine ${on_cluster} AS
SELECT * FROM ${db}.quarantine_store FINAL
SETTINGS do_not_merge_across_partitions_select_final = 1;

-- Records that could not be parsed or violate the contract, with their raw bytes.
CREATE OR REPLACE VIEW ${db}.dead_letters ${on_cluster} AS
SELECT * FROM ${db}.dead_letters_store FINAL;

-- Alerts raised and resolved, latest state per alert.
CREATE OR REPLACE VIEW ${db}.alerts ${on_cluster} AS
SELECT * FROM ${db}.alerts_store FINAL
SETTINGS do_not_merge_across_partitions_select_final = 1;

-- The billable rows: provider_turn usage only (run_total never reaches billing).
-- superseded marks an estimate for which a reported row of the same (run_id, turn,
-- attempt) exists (set by the run-semantics core, which sees both rows): reported usage
-- always wins, so billing skips superseded estimates.
CREATE OR REPLACE VIEW ${db}.billing_usage ${on_cluster} AS
SELECT * EXCEPT (version)
FROM ${db}.usage_store FINAL
WHERE scope = 'provider_turn'
SETTINGS do_not_merge_across_partitions_select_final = 1;
