-- Invariant checks for `ledgerbatch verify`: each query returns one row per violation, with a `problem` column.

-- name: verify_tiling
-- Committed live ranges tile each partition from its start offset to its cursor, no gap or overlap.
-- Acknowledged lost ranges are tiles too.
WITH tiles AS (
    SELECT topic, partition, from_offset, until_offset FROM ledger.batch_ranges
    WHERE pipeline = :pipeline AND kind = 'live' AND committed
    UNION ALL
    SELECT topic, partition, from_offset, until_offset FROM ledger.lost_ranges WHERE pipeline = :pipeline
), r AS (
    SELECT t.topic, t.partition, t.from_offset, t.until_offset,
           lag(t.until_offset) OVER (PARTITION BY t.topic, t.partition ORDER BY t.from_offset) AS previous_until
    FROM tiles t
)
SELECT format('%s[%s]: range [%s, %s) starts at %s but the previous one ends at %s',
              r.topic, r.partition, r.from_offset, r.until_offset, r.from_offset, coalesce(r.previous_until, c.start_offset)) AS problem
FROM r JOIN ledger.cursors c ON c.pipeline = :pipeline AND c.topic = r.topic AND c.partition = r.partition
WHERE r.from_offset <> coalesce(r.previous_until, c.start_offset)
UNION ALL
SELECT format('%s[%s]: cursor at %s but committed ranges end at %s',
              c.topic, c.partition, c.next_offset, coalesce(max(r.until_offset), c.start_offset))
FROM ledger.cursors c
LEFT JOIN tiles r ON r.topic = c.topic AND r.partition = c.partition
WHERE c.pipeline = :pipeline
GROUP BY c.topic, c.partition, c.next_offset, c.start_offset
HAVING c.next_offset <> coalesce(max(r.until_offset), c.start_offset);

-- name: verify_batches
-- A batch is committed exactly when its ranges are; counts reconcile per batch and per range.
SELECT format('batch %s (%s): records_read %s but its ranges read %s', b.batch_id, b.status, b.records_read, sum(r.records_read)) AS problem
FROM ledger.batches b JOIN ledger.batch_ranges r USING (batch_id)
WHERE b.pipeline = :pipeline AND b.status = 'committed'
GROUP BY b.batch_id, b.status, b.records_read
HAVING b.records_read IS DISTINCT FROM sum(r.records_read)
UNION ALL
SELECT format('batch %s is %s but its range %s[%s] is%s marked committed', b.batch_id, b.status, r.topic, r.partition,
              CASE WHEN r.committed THEN '' ELSE ' not' END)
FROM ledger.batches b JOIN ledger.batch_ranges r USING (batch_id)
WHERE b.pipeline = :pipeline AND (b.status = 'committed') <> r.committed
UNION ALL
SELECT format('%s[%s]: cursor names batch %s, which is not a committed live batch', c.topic, c.partition, c.last_batch_id)
FROM ledger.cursors c LEFT JOIN ledger.batches b ON b.batch_id = c.last_batch_id
WHERE c.pipeline = :pipeline AND c.last_batch_id IS NOT NULL
  AND (b.batch_id IS NULL OR b.status <> 'committed' OR b.kind <> 'live' OR b.pipeline <> c.pipeline);

-- name: verify_staging
-- Staging tables outlive only unfinished batches.
SELECT format('orphan staging table ledger_staging.%s (batch %s)', t.table_name, coalesce(b.status, 'unknown')) AS problem
FROM information_schema.tables t
LEFT JOIN ledger.batches b ON b.batch_id = substring(t.table_name FROM '^b(\d+)_a')::bigint
WHERE t.table_schema = 'ledger_staging' AND (b.batch_id IS NULL OR b.status IN ('committed', 'abandoned'))
  AND (b.pipeline = :pipeline OR b.batch_id IS NULL);

-- name: verify_target_rows
-- Every target row comes from a committed batch and lies inside a committed range of this pipeline;
-- no coordinate is both delivered and quarantined.
SELECT format('%s target rows carry batch ids that are not committed batches of this pipeline (e.g. %s)',
              count(*), min(t._batch_id)) AS problem
FROM {schema}.{table} t LEFT JOIN ledger.batches b ON b.batch_id = t._batch_id AND b.pipeline = :pipeline AND b.status = 'committed'
WHERE b.batch_id IS NULL
HAVING count(*) > 0
UNION ALL
SELECT format('%s target rows lie outside every committed range (e.g. %s[%s] offset %s)',
              count(*), min(t._topic), min(t._partition), min(t._offset))
FROM {schema}.{table} t
WHERE NOT EXISTS (SELECT 1 FROM ledger.batch_ranges r
                  WHERE r.pipeline = :pipeline AND r.committed AND r.topic = t._topic AND r.partition = t._partition
                    AND t._offset >= r.from_offset AND t._offset < r.until_offset)
HAVING count(*) > 0
UNION ALL
SELECT format('%s coordinates are both in the target and in quarantine (e.g. %s[%s] offset %s)',
              count(*), min(q.topic), min(q.partition), min(q."offset"))
FROM ledger.quarantine q JOIN {schema}.{table} t ON t._topic = q.topic AND t._partition = q.partition AND t._offset = q."offset"
WHERE q.pipeline = :pipeline
HAVING count(*) > 0;

-- name: verify_append_counts
-- Append targets: rows + quarantined records = records read by committed live and backfill batches.
SELECT format('target holds %s rows and quarantine %s records, but committed batches read %s records',
              (SELECT count(*) FROM {schema}.{table}),
              (SELECT count(*) FROM ledger.quarantine WHERE pipeline = :pipeline),
              (SELECT coalesce(sum(records_read), 0) FROM ledger.batches
               WHERE pipeline = :pipeline AND status = 'committed' AND kind IN ('live', 'backfill'))) AS problem
WHERE (SELECT count(*) FROM {schema}.{table}) + (SELECT count(*) FROM ledger.quarantine WHERE pipeline = :pipeline)
   <> (SELECT coalesce(sum(records_read), 0) FROM ledger.batches
       WHERE pipeline = :pipeline AND status = 'committed' AND kind IN ('live', 'backfill'));
