-- Least privilege: a writer role for pipelines and a read-only inspector role.
-- Both are NOLOGIN groups: grant them to login roles (GRANT ledgerbatch_writer TO etl_user).
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'ledgerbatch_writer') THEN
        CREATE ROLE ledgerbatch_writer NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'ledgerbatch_inspector') THEN
        CREATE ROLE ledgerbatch_inspector NOLOGIN;
    END IF;
END
$$;

-- Offsets deleted from Kafka before they were delivered, acknowledged by an operator so the
-- pipeline can go on. Nothing is ever skipped without a row here.
CREATE TABLE IF NOT EXISTS ledger.lost_ranges (
    pipeline        text        NOT NULL,
    topic           text        NOT NULL,
    partition       integer     NOT NULL CHECK (partition >= 0),
    from_offset     bigint      NOT NULL CHECK (from_offset >= 0),
    until_offset    bigint      NOT NULL,
    acknowledged_by text        NOT NULL CHECK (acknowledged_by <> ''),
    acknowledged_at timestamptz NOT NULL DEFAULT now(),
    reason          text,
    PRIMARY KEY (pipeline, topic, partition, from_offset),
    CHECK (from_offset < until_offset),
    EXCLUDE USING gist (pipeline WITH =, topic WITH =, partition WITH =, int8range(from_offset, until_offset) WITH &&)
);

-- A cursor may now move past a lost range without a batch.
ALTER TABLE ledger.cursors DROP CONSTRAINT IF EXISTS cursors_check1;
ALTER TABLE ledger.cursors DROP CONSTRAINT IF EXISTS cursors_last_batch_moved;
ALTER TABLE ledger.cursors ADD CONSTRAINT cursors_last_batch_moved
    CHECK (last_batch_id IS NULL OR next_offset > start_offset);

GRANT USAGE ON SCHEMA ledger TO ledgerbatch_writer, ledgerbatch_inspector;
GRANT SELECT ON ALL TABLES IN SCHEMA ledger TO ledgerbatch_inspector;
GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA ledger TO ledgerbatch_writer;
GRANT USAGE ON ALL SEQUENCES IN SCHEMA ledger TO ledgerbatch_writer;
REVOKE INSERT, UPDATE ON ledger.schema_migrations FROM ledgerbatch_writer;  -- `migrate` runs as the owner
GRANT USAGE, CREATE ON SCHEMA ledger_staging TO ledgerbatch_writer;
-- The writer deletes only what a replay replaces (quarantined records of replayed ranges).
GRANT DELETE ON ledger.quarantine TO ledgerbatch_writer;
ALTER DEFAULT PRIVILEGES IN SCHEMA ledger GRANT SELECT ON TABLES TO ledgerbatch_inspector;
ALTER DEFAULT PRIVILEGES IN SCHEMA ledger GRANT SELECT, INSERT, UPDATE ON TABLES TO ledgerbatch_writer;
ALTER DEFAULT PRIVILEGES IN SCHEMA ledger GRANT USAGE ON SEQUENCES TO ledgerbatch_writer;
