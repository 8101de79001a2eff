-- Change data capture (issue #11): deletes and skipped records are counted, deleted keys are remembered.

-- A change pipeline (format debezium, or upsert with target.deletes) reads records that delete a key
-- (rows_deleted: delete records, not target rows) and records it skips by design (records_skipped:
-- Debezium's tombstones), per batch and per range.
ALTER TABLE ledger.batches
    ADD COLUMN IF NOT EXISTS rows_deleted    bigint NOT NULL DEFAULT 0 CHECK (rows_deleted >= 0),
    ADD COLUMN IF NOT EXISTS records_skipped bigint NOT NULL DEFAULT 0 CHECK (records_skipped >= 0);
ALTER TABLE ledger.batch_ranges
    ADD COLUMN IF NOT EXISTS rows_deleted    bigint CHECK (rows_deleted >= 0),
    ADD COLUMN IF NOT EXISTS records_skipped bigint CHECK (records_skipped >= 0);

-- read = written + deleted + skipped + filtered + quarantined replaces 005's batches_counts_add_up.
ALTER TABLE ledger.batches DROP CONSTRAINT IF EXISTS batches_counts_add_up;
ALTER TABLE ledger.batches ADD CONSTRAINT batches_counts_add_up
    CHECK (status NOT IN ('staged', 'committed')
           OR (staging_table IS NOT NULL
               AND records_read = rows_written + rows_deleted + records_skipped + records_filtered + rows_quarantined));

-- The last delete of each deleted key of a change pipeline, with its source coordinates, one table per
-- pipeline (modes/upsert.py): with the target's rows it holds the last change of every key delivered,
-- so a replay never brings back a row that a later change deleted.
CREATE SCHEMA IF NOT EXISTS ledger_deletes;
GRANT USAGE, CREATE ON SCHEMA ledger_deletes TO ledgerbatch_writer;
GRANT USAGE ON SCHEMA ledger_deletes TO ledgerbatch_inspector;
ALTER DEFAULT PRIVILEGES IN SCHEMA ledger_deletes GRANT SELECT ON TABLES TO ledgerbatch_inspector;
