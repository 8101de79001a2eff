-- Named queries of the ledger. Bind parameters are :name; {placeholders} take quoted identifiers only.

-- name: bootstrap
CREATE SCHEMA IF NOT EXISTS ledger;
CREATE TABLE IF NOT EXISTS ledger.schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: migration_lock
SELECT pg_advisory_xact_lock(hashtext('ledgerbatch:migrate'));

-- name: applied_migrations
SELECT version FROM ledger.schema_migrations;

-- name: record_migration
INSERT INTO ledger.schema_migrations (version, name) VALUES (:version, :name);

-- name: pipeline_lock
SELECT pg_advisory_xact_lock(hashtext('ledgerbatch:pipeline:' || :pipeline));

-- name: open_live_batch
SELECT batch_id FROM ledger.batches
WHERE pipeline = :pipeline AND kind = 'live' AND status IN ('planned', 'staged', 'failed');

-- name: get_batch
SELECT batch_id, pipeline, kind, status, attempt, staging_table, records_read, rows_written,
       rows_quarantined, error
FROM ledger.batches WHERE batch_id = :batch_id;

-- name: lock_batch
SELECT batch_id, pipeline, kind, status, attempt, staging_table, records_read, rows_written,
       rows_quarantined, error
FROM ledger.batches WHERE batch_id = :batch_id FOR UPDATE;

-- name: get_ranges
SELECT topic, partition, from_offset, until_offset, records_read
FROM ledger.batch_ranges WHERE batch_id = :batch_id ORDER BY topic, partition;

-- name: get_cursors
SELECT topic, partition, next_offset FROM ledger.cursors WHERE pipeline = :pipeline;

-- name: init_cursor
INSERT INTO ledger.cursors (pipeline, topic, partition, start_offset, next_offset)
VALUES (:pipeline, :topic, :partition, :offset, :offset)
ON CONFLICT (pipeline, topic, partition) DO NOTHING;

-- name: insert_batch
INSERT INTO ledger.batches (pipeline, kind) VALUES (:pipeline, :kind) RETURNING batch_id;

-- name: insert_range
INSERT INTO ledger.batch_ranges (batch_id, pipeline, kind, topic, partition, from_offset, until_offset)
VALUES (:batch_id, :pipeline, :kind, :topic, :partition, :from_offset, :until_offset);

-- name: begin_attempt
UPDATE ledger.batches
SET attempt = attempt + 1, status = 'planned', staging_table = NULL, error = NULL,
    records_read = NULL, rows_written = NULL, rows_quarantined = NULL, staged_at = NULL, updated_at = now()
WHERE batch_id = :batch_id AND status IN ('planned', 'staged', 'failed')
RETURNING attempt;

-- name: mark_staged
UPDATE ledger.batches
SET status = 'staged', staging_table = :staging_table, records_read = :records_read,
    rows_written = :rows_written, rows_quarantined = :rows_quarantined, staged_at = now(), updated_at = now()
WHERE batch_id = :batch_id AND attempt = :attempt AND status = 'planned';

-- name: set_range_count
UPDATE ledger.batch_ranges SET records_read = :records_read
WHERE batch_id = :batch_id AND topic = :topic AND partition = :partition;

-- name: mark_failed
UPDATE ledger.batches SET status = 'failed', error = :error, updated_at = now()
WHERE batch_id = :batch_id AND attempt = :attempt AND status IN ('planned', 'staged');

-- name: advance_cursor
UPDATE ledger.cursors
SET next_offset = :until_offset, last_batch_id = :batch_id, updated_at = now()
WHERE pipeline = :pipeline AND topic = :topic AND partition = :partition AND next_offset = :from_offset;

-- name: mark_ranges_committed
UPDATE ledger.batch_ranges SET committed = true WHERE batch_id = :batch_id;

-- name: mark_committed
UPDATE ledger.batches SET status = 'committed', committed_at = now(), updated_at = now()
WHERE batch_id = :batch_id;

-- name: known_pipelines
SELECT DISTINCT pipeline FROM ledger.batches ORDER BY pipeline;

-- name: table_columns
SELECT column_name, data_type, numeric_precision, numeric_scale
FROM information_schema.columns
WHERE table_schema = :schema AND table_name = :table ORDER BY ordinal_position;

-- name: insert_lost_range
INSERT INTO ledger.lost_ranges (pipeline, topic, partition, from_offset, until_offset, acknowledged_by, reason)
VALUES (:pipeline, :topic, :partition, :from_offset, :until_offset, :acknowledged_by, :reason);

-- name: skip_lost_cursor
UPDATE ledger.cursors SET next_offset = :until_offset, updated_at = now()
WHERE pipeline = :pipeline AND topic = :topic AND partition = :partition AND next_offset = :from_offset;
