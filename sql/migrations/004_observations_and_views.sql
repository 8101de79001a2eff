-- Operations: end offsets observed at plan time, and inspection views over the ledger.

-- The log start and read_committed end of each partition as the planner last saw them, so that
-- lag can be read with SQL without asking Kafka. One row per partition, rewritten by a plan that
-- sees the offsets moved (observed_at: when these offsets were first seen).
-- No checks on the offsets: a record of what the broker said must never fail a plan.
CREATE TABLE IF NOT EXISTS ledger.end_offsets (
    pipeline    text        NOT NULL,
    topic       text        NOT NULL,
    partition   integer     NOT NULL,
    log_start   bigint      NOT NULL,
    end_offset  bigint      NOT NULL,
    observed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pipeline, topic, partition)
);

-- Batch history: recent_batches (002) keeps its columns; these are appended (CREATE OR REPLACE
-- VIEW only allows new columns at the end). planned_to_staged includes any wait for a worker.
CREATE OR REPLACE VIEW ledger.recent_batches AS
SELECT b.batch_id, b.pipeline, b.kind, b.status, b.attempt, b.records_read, b.rows_written,
       b.rows_quarantined, b.created_at, b.committed_at,
       b.committed_at - b.created_at AS duration, b.error,
       (SELECT count(*) FROM ledger.batch_ranges r WHERE r.batch_id = b.batch_id) AS ranges,
       (SELECT coalesce(sum(r.until_offset - r.from_offset), 0) FROM ledger.batch_ranges r
        WHERE r.batch_id = b.batch_id) AS offsets,
       b.staged_at,
       b.staged_at - b.created_at AS planned_to_staged,
       b.committed_at - b.staged_at AS staged_to_committed,
       round(b.records_read / nullif(extract(epoch FROM b.committed_at - b.created_at), 0))::bigint
           AS records_per_second
FROM ledger.batches b
ORDER BY b.batch_id DESC;

-- Lag per pipeline and partition: the cursor against the end offset observed at the last plan.
CREATE OR REPLACE VIEW ledger.partition_lag AS
SELECT c.pipeline, c.topic, c.partition, c.next_offset AS cursor, e.log_start, e.end_offset,
       e.end_offset - c.next_offset AS lag,
       c.next_offset - e.log_start AS retention_headroom,  -- offsets retention may still delete safely
       c.next_offset < e.log_start AS lost,                 -- undelivered offsets already deleted
       e.observed_at, c.last_batch_id, c.updated_at AS cursor_moved_at
FROM ledger.cursors c
LEFT JOIN ledger.end_offsets e USING (pipeline, topic, partition)
ORDER BY c.pipeline, c.topic, c.partition;

-- pipeline_progress (002) gains the total observed lag.
CREATE OR REPLACE VIEW ledger.pipeline_progress AS
SELECT c.pipeline,
       count(*)                         AS partitions,
       sum(c.next_offset - c.start_offset) AS offsets_delivered,
       max(c.updated_at)                AS last_commit_at,
       max(c.last_batch_id)             AS last_batch_id,
       sum(e.end_offset - c.next_offset) AS lag,
       min(e.observed_at)               AS lag_observed_at
FROM ledger.cursors c
LEFT JOIN ledger.end_offsets e USING (pipeline, topic, partition)
GROUP BY c.pipeline;

-- The ledger's own invariants for every pipeline, one row per violation (empty when all hold).
-- `ledgerbatch verify PIPELINE` checks the same plus the target rows, whose table only the spec names.
-- `ledgerbatch verify` reads this view for the ledger's part of its checks.
CREATE OR REPLACE VIEW ledger.invariant_violations AS
WITH tiles AS (
    SELECT pipeline, topic, partition, from_offset, until_offset FROM ledger.batch_ranges
    WHERE kind = 'live' AND committed
    UNION ALL
    SELECT pipeline, topic, partition, from_offset, until_offset FROM ledger.lost_ranges
), ordered AS (
    SELECT t.*, lag(t.until_offset) OVER (PARTITION BY t.pipeline, t.topic, t.partition
                                          ORDER BY t.from_offset) AS previous_until
    FROM tiles t
)
SELECT o.pipeline, 'tiling' AS invariant,
       o.topic || '[' || o.partition || ']: range [' || o.from_offset || ', ' || o.until_offset || ') starts at '
           || o.from_offset || ' but the previous one ends at ' || coalesce(o.previous_until, c.start_offset) AS problem
FROM ordered o JOIN ledger.cursors c USING (pipeline, topic, partition)
WHERE o.from_offset <> coalesce(o.previous_until, c.start_offset)
UNION ALL
SELECT c.pipeline, 'tiling',
       c.topic || '[' || c.partition || ']: cursor at ' || c.next_offset || ' but committed ranges end at '
           || coalesce(max(t.until_offset), c.start_offset)
FROM ledger.cursors c LEFT JOIN tiles t USING (pipeline, topic, partition)
GROUP BY c.pipeline, c.topic, c.partition, c.next_offset, c.start_offset
HAVING c.next_offset <> coalesce(max(t.until_offset), c.start_offset)
UNION ALL
SELECT b.pipeline, 'counts',
       'batch ' || b.batch_id || ' (' || b.status || '): records_read ' || coalesce(b.records_read::text, '')
           || ' but its ranges read ' || coalesce(sum(r.records_read)::text, '')
FROM ledger.batches b JOIN ledger.batch_ranges r USING (batch_id)
WHERE b.status = 'committed'
GROUP BY b.batch_id, b.pipeline, b.status, b.records_read
HAVING b.records_read IS DISTINCT FROM sum(r.records_read)
UNION ALL
SELECT b.pipeline, 'ranges',
       'batch ' || b.batch_id || ' is ' || b.status || ' but its range ' || r.topic || '[' || r.partition || '] is'
           || CASE WHEN r.committed THEN '' ELSE ' not' END || ' marked committed'
FROM ledger.batches b JOIN ledger.batch_ranges r USING (batch_id)
WHERE (b.status = 'committed') <> r.committed
UNION ALL
SELECT c.pipeline, 'cursors',
       c.topic || '[' || c.partition || ']: cursor names batch ' || c.last_batch_id
           || ', which is not a committed live batch'
FROM ledger.cursors c LEFT JOIN ledger.batches b ON b.batch_id = c.last_batch_id
WHERE c.last_batch_id IS NOT NULL
  AND (b.batch_id IS NULL OR b.status <> 'committed' OR b.kind <> 'live' OR b.pipeline <> c.pipeline)
UNION ALL
-- (No percent signs in this file: migrations run through the driver's parameter style.)
-- pg_tables, not information_schema: the read-only inspector role must see tables it cannot read.
SELECT b.pipeline, 'staging',
       'orphan staging table ledger_staging.' || t.tablename || ' (batch ' || coalesce(b.status, 'unknown') || ')'
FROM pg_catalog.pg_tables t
LEFT JOIN ledger.batches b ON b.batch_id = substring(t.tablename FROM '^b(\d+)_a\d+(_bad)?$')::bigint
WHERE t.schemaname = 'ledger_staging' AND (b.batch_id IS NULL OR b.status IN ('committed', 'abandoned'));

-- Quarantined records by reason: values in quotes and free-standing numbers (positions) are masked
-- so that one kind of error is one row (`sample` shows one real message). UTF-8 and ISO-8601 stay.
CREATE OR REPLACE VIEW ledger.quarantine_summary AS
SELECT q.pipeline,
       regexp_replace(q.error, '"([^"\\]|\\.)*"|(?<![\w-])\d+\M', '…', 'g') AS reason,
       count(*)                    AS records,
       count(DISTINCT (q.topic, q.partition)) AS partitions,
       min(q.batch_id)             AS first_batch_id,
       max(q.batch_id)             AS last_batch_id,
       max(q.quarantined_at)       AS last_quarantined_at,
       min(q.error)                AS sample
FROM ledger.quarantine q
GROUP BY q.pipeline, 2
ORDER BY q.pipeline, records DESC, reason;

GRANT SELECT ON ledger.end_offsets, ledger.recent_batches, ledger.partition_lag, ledger.pipeline_progress,
    ledger.invariant_violations, ledger.quarantine_summary TO ledgerbatch_inspector;
GRANT SELECT, INSERT, UPDATE ON ledger.end_offsets TO ledgerbatch_writer;
