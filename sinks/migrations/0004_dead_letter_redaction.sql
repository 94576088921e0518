-- Dead letters keep the size, the SHA-256 and a bounded, redacted preview of the record; the
-- full bytes stay on the DLQ topic (SECURITY.md). New rows carry the three columns and an
-- empty raw. Rows written before this migration get size and sha256 from the bytes they kept
-- (a DEFAULT is computed on read for parts written before its column existed) and an empty
-- preview; their raw bytes stay in dead_letters_store, which no read-only account can read,
-- until an operator clears them (sinks/SCHEMA.md).
ALTER TABLE ${db}.dead_letters_store ${on_cluster}
    ADD COLUMN IF NOT EXISTS size UInt64 DEFAULT length(raw) AFTER reason,
    ADD COLUMN IF NOT EXISTS sha256 String DEFAULT lower(hex(SHA256(raw))) AFTER size,
    ADD COLUMN IF NOT EXISTS preview String DEFAULT '' AFTER sha256;

-- The view shows what is kept, never the raw bytes.
CREATE OR REPLACE VIEW ${db}.dead_letters ${on_cluster} AS
SELECT source, partition, offset, code, reason, size, sha256, preview, received_at
FROM ${db}.dead_letters_store FINAL;
