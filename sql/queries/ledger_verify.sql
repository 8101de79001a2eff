-- Invariant checks for `ledgerbatch verify` (through ledger.py): each query returns one row per
-- violation, with a `problem` column.

-- name: verify_ledger
-- The ledger's own invariants (tiling, counts, ranges, cursors, staging) live in the view
-- ledger.invariant_violations (sql/migrations/004); staging tables of unknown batches belong to no pipeline.
-- A staging table whose batch a compaction folded (its id at or below a pipeline's folded batches, and gone
-- from ledger.batches) is no orphan: a login that may not drop it (an admin's compaction of the writer's
-- pipeline) leaves it to its owner's next clean-up (a commit, run, abandon: drop_finished_staging).
SELECT v.problem FROM ledger.invariant_violations v
WHERE (v.pipeline = :pipeline OR v.pipeline IS NULL)
  AND NOT (v.pipeline IS NULL AND EXISTS (
      SELECT FROM ledger.compactions c
      WHERE c.through_batch_id >= substring(v.problem FROM '^orphan staging table ledger_staging\.b(\d+)_a\d+(_bad)? \(batch unknown\)$')::bigint))
UNION ALL
-- Backfills deliver each offset once (migration 015): a committed backfill range overlaps no other committed
-- live or backfill range, nor the offsets the partition's checkpoint holds as delivered.
SELECT format('%s[%s]: backfill batch %s delivered [%s, %s), which batch %s delivered too',
              r.topic, r.partition, r.batch_id, r.from_offset, r.until_offset, o.batch_id)
FROM ledger.batch_ranges r JOIN ledger.batch_ranges o
  ON o.pipeline = r.pipeline AND o.topic = r.topic AND o.partition = r.partition AND o.committed
 AND o.kind IN ('live', 'backfill') AND (o.kind = 'live' OR o.batch_id < r.batch_id)
 AND o.from_offset < r.until_offset AND r.from_offset < o.until_offset
WHERE r.pipeline = :pipeline AND r.kind = 'backfill' AND r.committed
UNION ALL
SELECT format('%s[%s]: backfill batch %s delivered [%s, %s), which compacted batches delivered too (%s)',
              r.topic, r.partition, r.batch_id, r.from_offset, r.until_offset,
              int8multirange(int8range(r.from_offset, r.until_offset))
                * (k.backfilled + k.backfilled_unknown + int8multirange(int8range(k.from_offset, k.until_offset))))
FROM ledger.batch_ranges r JOIN ledger.checkpoints k USING (pipeline, topic, partition)
WHERE r.pipeline = :pipeline AND r.kind = 'backfill' AND r.committed AND r.from_offset < r.until_offset
  AND int8multirange(int8range(r.from_offset, r.until_offset))
      && (k.backfilled + k.backfilled_unknown + int8multirange(int8range(k.from_offset, k.until_offset)))
UNION ALL
SELECT format('%s[%s]: the checkpoint holds offsets %s as both backfilled and live [%s, %s)', k.topic, k.partition,
              k.backfilled * int8multirange(int8range(k.from_offset, k.until_offset)), k.from_offset, k.until_offset)
FROM ledger.checkpoints k
WHERE k.pipeline = :pipeline AND k.backfilled && int8multirange(int8range(k.from_offset, k.until_offset))
UNION ALL
-- A backfill delivers only offsets before the partition's start (plan/replay.py), and a move of the cursor back
-- never goes below what one delivered (ledger_offsets.sql: delivered_between): one past the start claims
-- offsets as delivered that the live batches will read again.
SELECT format('%s[%s]: backfill batch %s delivered [%s, %s), past the partition''s start offset %s',
              r.topic, r.partition, r.batch_id, r.from_offset, r.until_offset, c.start_offset)
FROM ledger.batch_ranges r JOIN ledger.cursors c USING (pipeline, topic, partition)
WHERE r.pipeline = :pipeline AND r.kind = 'backfill' AND r.committed AND r.until_offset > c.start_offset
UNION ALL
-- Only the spans compaction kept exactly: migration 015's backfilled_unknown of a ledger compacted before it
-- may reach past the start over offsets skipped or lost there, delivered by nobody.
SELECT format('%s[%s]: compacted backfills delivered %s, past the partition''s start offset %s', k.topic, k.partition,
              k.backfilled * int8multirange(int8range(c.start_offset, NULL)), c.start_offset)
FROM ledger.checkpoints k JOIN ledger.cursors c USING (pipeline, topic, partition)
WHERE k.pipeline = :pipeline AND k.backfilled && int8multirange(int8range(c.start_offset, NULL));

-- name: verify_target_rows
-- Every target row comes from a committed batch and lies inside a committed range of this pipeline;
-- no coordinate is delivered twice (an append target is unique per batch partition only) or is both
-- delivered and quarantined; every quarantined record lies inside a committed range too.
SELECT format('%s target rows carry batch ids that are not committed batches of this pipeline (e.g. %s)',
              count(*), min(t._batch_id)) AS problem
FROM {schema}.{table} t LEFT JOIN ledger.batches b ON b.batch_id = t._batch_id AND b.pipeline = :pipeline AND b.status = 'committed'
WHERE b.batch_id IS NULL
  AND t._batch_id > coalesce((SELECT through_batch_id FROM ledger.compactions WHERE pipeline = :pipeline), 0)
HAVING count(*) > 0
UNION ALL
SELECT * FROM (
    -- One pass over the target however many ranges the ledger holds: each batch's rows of a partition
    -- span offsets inside that batch's own range, or inside the compacted checkpoint. Only the rows of a
    -- span that does not are looked for in every committed range, one by one (the CTE keeps that order).
    WITH suspect AS MATERIALIZED (
        SELECT g._batch_id, g._topic, g._partition
        FROM (SELECT _batch_id, _topic, _partition, min(_offset) AS low, max(_offset) AS high
              FROM {schema}.{table} GROUP BY 1, 2, 3) g
        WHERE NOT EXISTS (SELECT 1 FROM ledger.batch_ranges r
                          WHERE r.batch_id = g._batch_id AND r.topic = g._topic AND r.partition = g._partition
                            AND r.pipeline = :pipeline AND r.committed AND g.low >= r.from_offset AND g.high < r.until_offset)
          AND NOT EXISTS (SELECT 1 FROM ledger.checkpoints k  -- compacted history (migrations 014, 015)
                          WHERE k.pipeline = :pipeline AND k.topic = g._topic AND k.partition = g._partition
                            AND ((g.low >= k.from_offset AND g.high < k.until_offset)
                                 OR int8range(g.low, g.high, '[]') <@ k.backfilled + k.backfilled_unknown)))
    SELECT format('%s target rows lie outside every committed range (e.g. %s[%s] offset %s)',
                  count(*), min(t._topic), min(t._partition), min(t._offset)) AS problem
    FROM suspect s
    JOIN {schema}.{table} t ON t._batch_id = s._batch_id AND t._topic = s._topic AND t._partition = s._partition
    WHERE NOT EXISTS (SELECT 1 FROM ledger.batch_ranges r
                      WHERE r.pipeline = :pipeline AND r.committed AND r.topic = t._topic AND r.partition = t._partition
                        AND t._offset >= r.from_offset AND t._offset < r.until_offset)
      AND NOT EXISTS (SELECT 1 FROM ledger.checkpoints k
                      WHERE k.pipeline = :pipeline AND k.topic = t._topic AND k.partition = t._partition
                        AND ((t._offset >= k.from_offset AND t._offset < k.until_offset)
                             OR k.backfilled @> t._offset OR k.backfilled_unknown @> t._offset))
    HAVING count(*) > 0) outside
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
HAVING count(*) > 0
UNION ALL
-- A quarantined record, as a row, lies inside a committed range or the compacted checkpoint: a range moved
-- off the only record it read (a poison one) leaves it outside, where its counts and Kafka may agree.
SELECT format('%s quarantined records lie outside every committed range (e.g. %s[%s] offset %s)',
              count(*), min(q.topic), min(q.partition), min(q."offset"))
FROM ledger.quarantine q
WHERE q.pipeline = :pipeline
  AND NOT EXISTS (SELECT 1 FROM ledger.batch_ranges r
                  WHERE r.pipeline = :pipeline AND r.committed AND r.topic = q.topic AND r.partition = q.partition
                    AND q."offset" >= r.from_offset AND q."offset" < r.until_offset)
  AND NOT EXISTS (SELECT 1 FROM ledger.checkpoints k
                  WHERE k.pipeline = :pipeline AND k.topic = q.topic AND k.partition = q.partition
                    AND ((q."offset" >= k.from_offset AND q."offset" < k.until_offset)
                         OR k.backfilled @> q."offset" OR k.backfilled_unknown @> q."offset"))
HAVING count(*) > 0;

-- name: verify_append_counts
-- Append targets: rows + quarantined records (bad or refused by the target) = records read by committed live
-- and backfill batches less what their query transforms filtered out, plus what each committed replay wrote,
-- quarantined and had refused less what it replaced (a replay with a changed query may keep more or fewer rows).
-- Compacted batches count through their sums in ledger.compactions, purged quarantine through its count there.
SELECT format('target holds %s rows and quarantine %s records (and %s purged), but committed batches read %s '
              'records, filtered %s and replays changed that by %s',
              (SELECT count(*) FROM {schema}.{table}),
              (SELECT count(*) FROM ledger.quarantine WHERE pipeline = :pipeline),
              d.purged, d.records_read, d.records_filtered, d.replayed) AS problem
FROM (SELECT b.records_read + coalesce(k.records_read, 0) AS records_read,
             b.records_filtered + coalesce(k.records_filtered, 0) AS records_filtered,
             b.replayed + coalesce(k.replay_delta, 0) AS replayed, coalesce(k.quarantine_purged, 0) AS purged
      FROM (SELECT coalesce(sum(records_read) FILTER (WHERE kind IN ('live', 'backfill')), 0) AS records_read,
                   coalesce(sum(records_filtered) FILTER (WHERE kind IN ('live', 'backfill')), 0) AS records_filtered,
                   coalesce(sum(rows_written + rows_quarantined + rows_rejected - records_replaced)
                            FILTER (WHERE kind = 'replay'), 0) AS replayed
            FROM ledger.batches
            WHERE pipeline = :pipeline AND status = 'committed') b
      LEFT JOIN ledger.compactions k ON k.pipeline = :pipeline) d
WHERE (SELECT count(*) FROM {schema}.{table}) + (SELECT count(*) FROM ledger.quarantine WHERE pipeline = :pipeline)
      + d.purged <> d.records_read - d.records_filtered + d.replayed;

-- name: verify_aggregate
-- Aggregate targets (modes/aggregate.py): contributions come from committed batches of this
-- pipeline, no two contributing batches delivered the same offset (a replay took the old one out),
-- and every group of the target equals its contributions merged.
SELECT format('%s contributions carry batch ids that are not committed batches of this pipeline (e.g. %s)',
              count(*), min(c._batch_id)) AS problem
FROM ledger_aggregates.{contributions} c
LEFT JOIN ledger.batches b ON b.batch_id = c._batch_id AND b.pipeline = :pipeline AND b.status = 'committed'
WHERE b.batch_id IS NULL
  AND c._batch_id > coalesce((SELECT through_batch_id FROM ledger.compactions WHERE pipeline = :pipeline), 0)
HAVING count(*) > 0
UNION ALL
SELECT format('offsets counted twice: %s[%s] [%s, %s) of batch %s overlaps batch %s',
              o.topic, o.partition, o.from_offset, o.until_offset, o.batch_id, o.previous_batch)
FROM (SELECT r.*, lag(r.until_offset) OVER w AS previous_until, lag(r.batch_id) OVER w AS previous_batch
      FROM ledger.batch_ranges r
      WHERE r.pipeline = :pipeline AND r.committed AND r.from_offset < r.until_offset
        AND r.batch_id IN (SELECT DISTINCT _batch_id FROM ledger_aggregates.{contributions})
      WINDOW w AS (PARTITION BY r.topic, r.partition ORDER BY r.from_offset)) o
WHERE o.from_offset < o.previous_until
UNION ALL
SELECT format('%s groups of the target differ from their contributions merged (e.g. %s)', count(*), min(ROW({key})::text))
FROM {schema}.{table} c
FULL JOIN (SELECT {key}, {measures_agg}, true AS _present FROM ledger_aggregates.{contributions} c GROUP BY {key}) r
     USING ({key})
WHERE c._batch_id IS NULL OR r._present IS NULL OR {differs}
HAVING count(*) > 0;

-- name: verify_deleted_keys
-- Change pipelines: a key is either a live row of the target or deleted (ledger_deletes), never both.
SELECT format('%s keys are both rows of the target and deleted in ledger_deletes.%s (e.g. %s)',
              count(*), :deletes, min(ROW({key_t})::text)) AS problem
FROM {schema}.{table} t JOIN ledger_deletes.{deletes} d ON {match}
HAVING count(*) > 0;
