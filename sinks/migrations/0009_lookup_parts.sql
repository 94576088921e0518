-- The tables a run's timeline reads one run at a time (runs_store, turns_store,
-- run_events_store; sinks._queries.run_timeline) keep parts of up to 256 MiB of
-- uncompressed data in the compact format: all columns in one file, so a lookup of one
-- run opens and reads one file per part instead of one per column (runs_store has 45
-- columns). On the 3M-row bench ledger the four timeline reads went from about 27 to
-- 19 ms (sinks/SCHEMA.md, "Part formats"). Larger parts, which only merges of a big
-- ledger produce, stay wide, where scans of a few columns are cheaper.
--
-- Only new parts take the setting: an insert, or a merge of compact parts. A merge that
-- includes a wide part writes a wide part, so the parts of an existing ledger stay wide
-- until they are rewritten (no statement here rewrites data). usage_store, which billing
-- scans, keeps the default.
ALTER TABLE ${db}.runs_store ${on_cluster}
    MODIFY SETTING min_bytes_for_wide_part = 268435456;

ALTER TABLE ${db}.turns_store ${on_cluster}
    MODIFY SETTING min_bytes_for_wide_part = 268435456;

ALTER TABLE ${db}.run_events_store ${on_cluster}
    MODIFY SETTING min_bytes_for_wide_part = 268435456;
