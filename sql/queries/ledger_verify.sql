-- Invariant checks for `ledgerbatch verify` (through ledger.py): each query returns one row per
-- violation, with a `problem` column.

-- name: verify_ledger
-- The ledger's own invariants (tiling, counts, ranges, cursors, staging) live in the view
-- ledger.invariant_violations (sql/migrations/004); staging tables of unknown batches belong to no pipeline.
SELECT problem FROM ledger.invariant_violations WHERE pipeline = :pipeline OR pipeline IS NULL;

-- name: verify_target_rows
-- Every target row comes from a committed batch and lies inside a committed range of this pipeline;
-- no coordinate is delivered twice (an append target is unique per batch partition only) or is both
-- delivered and quarantined.
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
SELECT format('%s coordinates appear more than once in the target (e.g. %s[%s] offset %s)',
              count(*), min(d._topic), min(d._partition), min(d._offset))
FROM (SELECT _topic, _partition, _offset FROM {schema}.{table} GROUP BY 1, 2, 3 HAVING count(*) > 1) d
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
