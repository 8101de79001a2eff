-- Query transforms and aggregate targets (issue #12).

-- A query may drop records (records_filtered); an aggregate batch writes groups (groups_written);
-- the query's output columns are fixed per batch when it is staged (output_schema, Spark DDL), so
-- the commit publishes exactly the shape that was staged.
ALTER TABLE ledger.batches
    ADD COLUMN IF NOT EXISTS records_filtered bigint NOT NULL DEFAULT 0 CHECK (records_filtered >= 0),
    ADD COLUMN IF NOT EXISTS groups_written   bigint CHECK (groups_written >= 0),
    ADD COLUMN IF NOT EXISTS output_schema    text;

-- read = written + filtered + quarantined replaces read = written + quarantined (001's unnamed check).
-- (No percent signs in this file: migrations run through the driver's parameter style.)
DO $$
DECLARE c record;
BEGIN
    FOR c IN SELECT conname FROM pg_constraint
             WHERE conrelid = 'ledger.batches'::regclass AND contype = 'c'
               AND position('records_read = (rows_written + rows_quarantined)' IN pg_get_constraintdef(oid)) > 0
    LOOP
        EXECUTE 'ALTER TABLE ledger.batches DROP CONSTRAINT ' || quote_ident(c.conname);
    END LOOP;
END $$;
ALTER TABLE ledger.batches ADD CONSTRAINT batches_counts_add_up
    CHECK (status NOT IN ('staged', 'committed')
           OR (staging_table IS NOT NULL AND records_read = rows_written + records_filtered + rows_quarantined));

-- What each staging task of a query pipeline read from its range, written in the task's own
-- transaction with the range's bad records: the counts of records a query drops or aggregates can
-- only be taken before the query. One row per attempt and range; a retried task replaces its row.
CREATE TABLE IF NOT EXISTS ledger.staged_reads (
    batch_id  bigint  NOT NULL REFERENCES ledger.batches (batch_id),
    attempt   integer NOT NULL,
    topic     text    NOT NULL,
    partition integer NOT NULL,
    records   bigint  NOT NULL CHECK (records >= 0),
    bad       bigint  NOT NULL CHECK (bad >= 0 AND bad <= records),
    PRIMARY KEY (batch_id, attempt, topic, partition)
);
GRANT SELECT ON ledger.staged_reads TO ledgerbatch_inspector;
GRANT SELECT, INSERT, UPDATE, DELETE ON ledger.staged_reads TO ledgerbatch_writer;

-- Aggregate targets keep each batch's contribution per group here (one table per pipeline), so a
-- replay can take a batch's old contribution out and recompute min and max exactly.
CREATE SCHEMA IF NOT EXISTS ledger_aggregates;
GRANT USAGE, CREATE ON SCHEMA ledger_aggregates TO ledgerbatch_writer;
GRANT USAGE ON SCHEMA ledger_aggregates TO ledgerbatch_inspector;
ALTER DEFAULT PRIVILEGES IN SCHEMA ledger_aggregates GRANT SELECT ON TABLES TO ledgerbatch_inspector;
