-- The price book: a unit price per provider, model, token kind and currency, valid from a
-- time on (until the next valid_from of the same key). `prism-pipeline prices load FILE`
-- writes it. Billing prices reported provider_turn usage that arrived without a cost with
-- the prices valid at the usage row's event time; estimates are never priced (rule 6).
-- token_kind is input (input tokens neither read from nor written to the prompt cache),
-- output, cache_read or cache_write; the cost of n tokens is n * unit_price / per_tokens.
-- A later load of the same key with another price writes a higher version, which wins.
CREATE TABLE IF NOT EXISTS ${db}.prices_store ${on_cluster}
(
    provider LowCardinality(String),
    model LowCardinality(String),
    token_kind LowCardinality(String),
    currency LowCardinality(String),
    valid_from DateTime64(3, 'UTC'),
    unit_price Decimal(38, 12),
    per_tokens UInt64,
    source String,
    loaded_at DateTime64(3, 'UTC'),
    version UInt64
)
ENGINE = ${engine:version}
ORDER BY (provider, model, token_kind, currency, valid_from)
SETTINGS ${dedup_window};

-- The current price book, one row per key.
CREATE OR REPLACE VIEW ${db}.prices ${on_cluster} AS
SELECT * EXCEPT (version) FROM ${db}.prices_store FINAL;
