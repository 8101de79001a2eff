-- Batches and their ranges: plan, attempts, staged counts, commit and abandon. Run only by
-- plugins/ledgerbatch/ledger/batches.py. Bind parameters are :name.

-- name: pipeline_lock
SELECT pg_advisory_xact_lock(hashtext('ledgerbatch:pipeline:' || :pipeline));

-- name: open_live_batch
SELECT batch_id FROM ledger.batches
WHERE pipeline = :pipeline AND kind = 'live' AND status IN ('planned', 'staged', 'failed');

-- name: get_batch
-- The batch with its ranges (by topic, partition) as parallel arrays: one statement, read several times a batch.
-- `lock`: FOR UPDATE OF b (the batch row locked), or nothing.
SELECT b.batch_id, b.pipeline, b.kind, b.status, b.attempt, b.staging_table, b.records_read, b.rows_written,
       b.rows_quarantined, b.error, b.records_filtered, b.groups_written, b.output_schema, b.rows_deleted,
       b.records_skipped, b.spec_version, b.rows_rejected, b.records_superseded, r.*
FROM ledger.batches b CROSS JOIN LATERAL (
    SELECT array_agg(topic ORDER BY topic, partition) AS range_topics,
           array_agg(partition ORDER BY topic, partition) AS range_partitions,
           array_agg(from_offset ORDER BY topic, partition) AS range_froms,
           array_agg(until_offset ORDER BY topic, partition) AS range_untils,
           array_agg(records_read ORDER BY topic, partition) AS range_reads,
           array_agg(rows_deleted ORDER BY topic, partition) AS range_deletes,
           array_agg(records_skipped ORDER BY topic, partition) AS range_skips
    FROM ledger.batch_ranges WHERE batch_id = b.batch_id) r
WHERE b.batch_id = :batch_id {lock};

-- name: insert_batch
INSERT INTO ledger.batches (pipeline, kind) VALUES (:pipeline, :kind) RETURNING batch_id;

-- name: insert_ranges
-- A planned batch's ranges in one statement (parallel arrays).
INSERT INTO ledger.batch_ranges (batch_id, pipeline, kind, topic, partition, from_offset, until_offset)
SELECT :batch_id, :pipeline, :kind, q.topic, q.partition, q.from_offset, q.until_offset
FROM unnest(CAST(:topics AS text[]), CAST(:partitions AS int[]), CAST(:from_offsets AS bigint[]),
            CAST(:until_offsets AS bigint[])) AS q(topic, partition, from_offset, until_offset);

-- name: record_spec_version
INSERT INTO ledger.spec_versions (pipeline, version, spec_text) VALUES (:pipeline, :version, :spec_text)
ON CONFLICT (pipeline, version) DO NOTHING;

-- name: pin_spec_version
-- A batch keeps the version it was first given (at its plan; a replay or backfill at its first attempt).
UPDATE ledger.batches SET spec_version = coalesce(spec_version, :version)
WHERE batch_id = :batch_id RETURNING spec_version;

-- name: begin_attempt
-- Never while another attempt holds a fresh lease (attempt_held).
UPDATE ledger.batches
SET attempt = attempt + 1, status = 'planned', staging_table = NULL, error = NULL,
    records_read = NULL, rows_written = NULL, rows_quarantined = NULL, staged_at = NULL, updated_at = now(),
    records_filtered = 0, groups_written = NULL, output_schema = :output_schema, rows_deleted = 0, records_skipped = 0,
    heartbeat_at = now()
WHERE batch_id = :batch_id AND status IN ('planned', 'staged', 'failed')
  AND NOT (status = 'planned' AND attempt > 0
           AND coalesce(heartbeat_at > now() - make_interval(secs => :lease_s), false))
RETURNING attempt;

-- name: attempt_held
-- Whether an attempt is being staged under a fresh lease.
SELECT status = 'planned' AND attempt > 0 AND coalesce(heartbeat_at > now() - make_interval(secs => :lease_s), false)
FROM ledger.batches WHERE batch_id = :batch_id;

-- name: renew_lease
UPDATE ledger.batches SET heartbeat_at = now()
WHERE batch_id = :batch_id AND attempt = :attempt AND status = 'planned';

-- name: mark_staged
UPDATE ledger.batches
SET status = 'staged', staging_table = :staging_table, records_read = :records_read,
    rows_written = :rows_written, rows_quarantined = :rows_quarantined, records_filtered = :records_filtered,
    groups_written = :groups_written, staged_at = now(), updated_at = now()
WHERE batch_id = :batch_id AND attempt = :attempt AND status = 'planned';

-- name: mark_staged_changes
-- Change pipelines, right after mark_staged in its transaction: of the rows written, these deleted a
-- key or were skipped (tombstones).
UPDATE ledger.batches
SET rows_written = rows_written - :rows_deleted - :records_skipped, rows_deleted = :rows_deleted,
    records_skipped = :records_skipped
WHERE batch_id = :batch_id AND attempt = :attempt AND status = 'staged';

-- name: staged_reads
-- What a query pipeline's staging tasks read per range (staging_tasks.sql: record_staged_read).
SELECT topic, partition, records, bad FROM ledger.staged_reads WHERE batch_id = :batch_id AND attempt = :attempt;

-- name: set_range_counts
-- Every range's records read (parallel arrays, a range a partition), and in change pipelines (:changes) its
-- deletes and skipped records, in one statement: one a range cost a round trip each (100 pipelines).
UPDATE ledger.batch_ranges r
SET records_read = u.records_read,
    rows_deleted = CASE WHEN :changes THEN u.rows_deleted ELSE r.rows_deleted END,
    records_skipped = CASE WHEN :changes THEN u.records_skipped ELSE r.records_skipped END
FROM unnest(CAST(:topics AS text[]), CAST(:partitions AS int[]), CAST(:records_read AS bigint[]),
            CAST(:rows_deleted AS bigint[]), CAST(:records_skipped AS bigint[]))
     AS u(topic, partition, records_read, rows_deleted, records_skipped)
WHERE r.batch_id = :batch_id AND r.topic = u.topic AND r.partition = u.partition;

-- name: mark_failed
UPDATE ledger.batches SET status = 'failed', error = :error, updated_at = now()
WHERE batch_id = :batch_id AND attempt = :attempt AND status IN ('planned', 'staged');

-- name: mark_ranges_committed
UPDATE ledger.batch_ranges SET committed = true WHERE batch_id = :batch_id;

-- name: mark_committed
UPDATE ledger.batches SET status = 'committed', committed_at = now(), updated_at = now()
WHERE batch_id = :batch_id;

-- name: forget_staged_reads
-- Once the batch is committed its counts are in batches and batch_ranges.
DELETE FROM ledger.staged_reads WHERE batch_id = :batch_id;

-- name: mark_abandoned
UPDATE ledger.batches SET status = 'abandoned', error = :reason, updated_at = now()
WHERE batch_id = :batch_id AND status IN ('planned', 'staged', 'failed');

-- name: record_replaced
UPDATE ledger.batches SET records_replaced = :records WHERE batch_id = :batch_id;

-- name: newest_committed_batch
SELECT max(batch_id) FROM ledger.batches WHERE pipeline = :pipeline AND status = 'committed';

-- name: known_pipelines
SELECT DISTINCT pipeline FROM ledger.batches ORDER BY pipeline;

-- name: finished_staging_tables
-- Staging tables whose batch is finished (left by a crash between COMMIT and the clean-up), or gone from
-- the ledger (compacted: a batch row exists before its staging table does), by the name of the good-rows
-- table (drop_staging drops the bad-records table with it). From pg_catalog, not information_schema, which
-- hides tables the login has no privilege on (the writer's, from an admin login); only those the login may
-- drop (it owns them, or is a member of their owner): the others are left for their owner's next clean-up.
SELECT DISTINCT regexp_replace(c.relname, '_bad$', '') AS table_name
FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN ledger.batches b ON b.batch_id = substring(c.relname FROM '^b(\d+)_a\d+(_bad)?$')::bigint
WHERE n.nspname = 'ledger_staging' AND c.relkind IN ('r', 'p') AND c.relname ~ '^b\d+_a\d+(_bad)?$'
  AND pg_has_role(c.relowner, 'USAGE')
  AND (b.batch_id IS NULL OR (b.pipeline = :pipeline AND b.status IN ('committed', 'abandoned')));

-- name: delivering_batches
-- Committed batches of the pipeline (other than :batch_id) whose ranges overlap the given ranges
-- (parallel arrays), with each of their ranges: an aggregate replay supersedes whole batches.
SELECT r.batch_id, r.topic, r.partition, r.from_offset, r.until_offset
FROM ledger.batch_ranges r
WHERE r.pipeline = :pipeline AND r.committed AND r.batch_id <> :batch_id
  AND r.batch_id IN (
      SELECT o.batch_id FROM ledger.batch_ranges o
      JOIN unnest(CAST(:topics AS text[]), CAST(:partitions AS int[]), CAST(:from_offsets AS bigint[]), CAST(:until_offsets AS bigint[]))
           AS q(topic, partition, from_offset, until_offset)
        ON o.topic = q.topic AND o.partition = q.partition
       AND o.from_offset < q.until_offset AND q.from_offset < o.until_offset
      WHERE o.pipeline = :pipeline AND o.committed)
ORDER BY r.batch_id, r.topic, r.partition;

-- name: record_set_aside
-- Staged rows the commit did not publish, refused by the target (rows_rejected) or older than their key's
-- newest change (records_superseded), were staged as written (or as deletes): they move to {bucket}.
UPDATE ledger.batches
SET rows_written = rows_written - (:rows - :deletes), rows_deleted = rows_deleted - :deletes,
    {bucket} = {bucket} + :rows, updated_at = now()
WHERE batch_id = :batch_id;

-- name: record_range_set_aside
UPDATE ledger.batch_ranges SET {bucket} = {bucket} + :rows
WHERE batch_id = :batch_id AND topic = :topic AND partition = :partition;

-- name: abandon_stranded
-- Replays and backfills nobody will finish (an interrupted `verify --deep` or `ledgerbatch replay`, a backfill
-- DAG run that failed and was never cleared): unfinished, no attempt staging them under a lease renewed within
-- :idle_s seconds, nothing done to them for :idle_s seconds nor since :before (the compaction's cut-off,
-- history.compact_after). They keep updated_at (when they were last worked on), so that compaction folds past
-- them at once; error says why, what they were, and the error they had.
WITH stranded AS (
    SELECT batch_id, status FROM ledger.batches
    WHERE pipeline = :pipeline AND kind IN ('replay', 'backfill') AND status IN ('planned', 'staged', 'failed')
      AND updated_at < :before AND updated_at < now() - make_interval(secs => :idle_s)
      AND coalesce(heartbeat_at < :before AND heartbeat_at < now() - make_interval(secs => :idle_s), true)
    ORDER BY batch_id
    FOR UPDATE SKIP LOCKED  -- a batch being committed (or taken over) right now is not stranded
)
UPDATE ledger.batches b
SET status = 'abandoned',
    error = left(:reason || ' (it was ' || s.status || ' at attempt ' || b.attempt || ', last worked on at '
                 || to_char(greatest(b.updated_at, b.heartbeat_at) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
                 || ')' || coalesce('; its error: ' || b.error, ''), 4000)
FROM stranded s
WHERE b.batch_id = s.batch_id
RETURNING b.batch_id, b.kind, s.status AS was, b.attempt, greatest(b.updated_at, b.heartbeat_at) AS last_worked_on;

-- name: first_batch_after
-- The pipeline's first batch after :batch_id (what a compaction that stopped at :batch_id stopped at).
SELECT batch_id, kind, status, attempt, updated_at FROM ledger.batches
WHERE pipeline = :pipeline AND batch_id > :batch_id ORDER BY batch_id LIMIT 1;
