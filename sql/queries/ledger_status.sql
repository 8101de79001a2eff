-- What `ledgerbatch status` and the demo's report read from the ledger (through ledger.py).

-- name: status_partitions
-- Each cursor with the end offsets observed at the last plan and the age of its last batch's commit.
SELECT c.topic, c.partition, c.next_offset, c.last_batch_id, e.log_start, e.end_offset, e.observed_at,
       extract(epoch FROM now() - coalesce(b.committed_at, c.updated_at))::float AS last_batch_age_s  -- compacted: the cursor's move
FROM ledger.cursors c
LEFT JOIN ledger.end_offsets e USING (pipeline, topic, partition)
LEFT JOIN ledger.batches b ON b.batch_id = c.last_batch_id
WHERE c.pipeline = :pipeline
ORDER BY c.topic, c.partition;

-- name: status_batches
-- The most recent batches, newest first, with their ages and phase durations in seconds.
SELECT batch_id, kind, status, attempt, records_read, rows_written, rows_quarantined, error,
       rows_deleted, records_skipped, records_filtered, rows_rejected, records_superseded,
       extract(epoch FROM now() - updated_at)::float AS age_s,
       extract(epoch FROM staged_at - created_at)::float AS planned_to_staged_s,
       extract(epoch FROM committed_at - staged_at)::float AS staged_to_committed_s
FROM ledger.batches WHERE pipeline = :pipeline ORDER BY batch_id DESC LIMIT :limit;

-- name: status_history
-- What compaction and quarantine retention folded (migration 014), with the partitions' replay horizons.
SELECT k.batches, k.through_batch_id, k.compacted_at, k.quarantine_purged, k.purged_at, k.deletes_folded,
       (SELECT string_agg(h.topic || '[' || h.partition || '] ' || h.replay_horizon, ', ' ORDER BY h.topic, h.partition)
        FROM ledger.checkpoints h WHERE h.pipeline = k.pipeline AND h.replay_horizon IS NOT NULL) AS horizons
FROM ledger.compactions k WHERE k.pipeline = :pipeline;

-- name: status_last_error
-- The newest batch that failed, or a live batch abandoned with a reason (replay dry runs keep their diff there).
SELECT batch_id, kind, status, error, extract(epoch FROM now() - updated_at)::float AS age_s
FROM ledger.batches
WHERE pipeline = :pipeline AND error IS NOT NULL AND (status = 'failed' OR (status = 'abandoned' AND kind = 'live'))
ORDER BY batch_id DESC LIMIT 1;

-- name: report_quarantine_by_reason
SELECT error, count(*) FROM ledger.quarantine GROUP BY error ORDER BY 2 DESC, 1;

-- name: report_batches
SELECT batch_id, kind, status, attempt, records_read, rows_written, rows_quarantined, committed_at - created_at AS took FROM ledger.batches ORDER BY batch_id;

-- name: report_cursors
SELECT topic, count(*) AS partitions, sum(next_offset) AS delivered_offsets FROM ledger.cursors GROUP BY topic;

-- name: quarantined_count
SELECT count(*) FROM ledger.quarantine WHERE pipeline = :pipeline;

-- name: upkeep_failed
-- An upkeep gave way (ops/upkeep_failures.py: record; migration 018): :failures more times in a row, the last
-- at :failed_at for :reason.
INSERT INTO ledger.upkeep_failures AS f (pipeline, upkeep, reason, sqlstate, failures, first_failed_at, failed_at)
VALUES (:pipeline, :upkeep, :reason, :sqlstate, :failures, :first_failed_at, :failed_at)
ON CONFLICT (pipeline, upkeep) DO UPDATE
SET reason = excluded.reason, sqlstate = excluded.sqlstate, failures = f.failures + excluded.failures,
    failed_at = greatest(f.failed_at, excluded.failed_at);

-- name: upkeep_worked
DELETE FROM ledger.upkeep_failures WHERE pipeline = :pipeline AND upkeep = :upkeep;

-- name: status_upkeep_failures
-- The pipeline's upkeeps failing now, whichever process ran them, the last failure first.
SELECT upkeep, reason, sqlstate, failures, first_failed_at, failed_at,
       extract(epoch FROM now() - failed_at)::float AS age_s
FROM ledger.upkeep_failures WHERE pipeline = :pipeline ORDER BY failed_at DESC, upkeep;

-- name: status_compaction_stops
-- Where compaction stops: the pipeline's first unfinished batch above what is folded (it folds nothing after
-- it until it is committed or abandoned); and the replays and backfills the upkeep abandoned that are still in
-- the ledger (compaction folded past them; they go with the next fold).
(SELECT 'stops at' AS what, batch_id, kind, status, attempt, error,
        extract(epoch FROM now() - updated_at)::float AS age_s
 FROM ledger.batches
 WHERE pipeline = :pipeline AND status IN ('planned', 'staged', 'failed')
   AND batch_id > coalesce((SELECT through_batch_id FROM ledger.compactions WHERE pipeline = :pipeline), 0)
 ORDER BY batch_id LIMIT 1)
UNION ALL
(SELECT 'abandoned', batch_id, kind, status, attempt, error, extract(epoch FROM now() - updated_at)::float
 FROM ledger.batches
 WHERE pipeline = :pipeline AND status = 'abandoned' AND starts_with(error, 'abandoned by the upkeep:')
 ORDER BY batch_id DESC LIMIT 5);
