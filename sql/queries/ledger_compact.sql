-- Ledger compaction and quarantine retention (plugins/ledgerbatch/ledger/compaction.py; migration 014).

-- name: compaction_lock
-- One compaction of a pipeline at a time (the commit's target lock orders it with commits).
SELECT pg_advisory_xact_lock(hashtext('ledgerbatch:compact:' || :pipeline));

-- name: foldable_through
-- The highest batch id up to which every batch of the pipeline finished before :before (committed, or
-- abandoned), and above what is folded already: a batch still open, failed or newer stops the fold.
SELECT coalesce(
    (SELECT min(batch_id) - 1 FROM ledger.batches
     WHERE pipeline = :pipeline AND batch_id > :folded
       AND NOT ((status = 'committed' AND committed_at < :before) OR (status = 'abandoned' AND updated_at < :before))),
    (SELECT max(batch_id) FROM ledger.batches WHERE pipeline = :pipeline AND batch_id > :folded),
    :folded) AS through;

-- name: folded_through
SELECT coalesce((SELECT through_batch_id FROM ledger.compactions WHERE pipeline = :pipeline), 0);

-- name: fold_step_through
-- One step of a compaction: up to the :batches-th batch of the pipeline above what is folded, at most :through.
SELECT least(:through, coalesce(
    (SELECT batch_id FROM ledger.batches WHERE pipeline = :pipeline AND batch_id > :folded
     ORDER BY batch_id OFFSET :batches - 1 LIMIT 1), :through)) AS through;

-- name: fold_checkpoints
-- Each partition's committed ranges up to :through join its checkpoint: live ranges extend it (they tile
-- on from its end), backfills add exactly the offsets they delivered to `backfilled` (migration 015; never a
-- span from the lowest of them, which would count offsets no batch delivered). With :horizon, replays must
-- start after the live offsets folded.
INSERT INTO ledger.checkpoints AS k (pipeline, topic, partition, from_offset, until_offset, backfilled_from,
                                     backfilled, records_read, ranges, replay_horizon)
SELECT r.pipeline, r.topic, r.partition,
       coalesce(min(r.from_offset) FILTER (WHERE r.kind = 'live'), c.start_offset),
       coalesce(max(r.until_offset) FILTER (WHERE r.kind = 'live'), c.start_offset),
       min(r.from_offset) FILTER (WHERE r.kind = 'backfill'),
       coalesce(range_agg(int8range(r.from_offset, r.until_offset)) FILTER (WHERE r.kind = 'backfill'),
                int8multirange()),
       coalesce(sum(r.records_read) FILTER (WHERE r.kind = 'live'), 0),
       count(*) FILTER (WHERE r.kind = 'live'),
       CASE WHEN :horizon THEN coalesce(max(r.until_offset) FILTER (WHERE r.kind = 'live'), c.start_offset) END
FROM ledger.batch_ranges r
JOIN ledger.cursors c ON c.pipeline = r.pipeline AND c.topic = r.topic AND c.partition = r.partition
WHERE r.pipeline = :pipeline AND r.batch_id > :folded AND r.batch_id <= :through AND r.committed
GROUP BY r.pipeline, r.topic, r.partition, c.start_offset
ON CONFLICT (pipeline, topic, partition) DO UPDATE
-- an empty live span (only backfills folded so far) starts where the live offsets folded now start: an
-- offset move may have put the start below it
SET from_offset = CASE WHEN k.until_offset = k.from_offset THEN least(k.from_offset, excluded.from_offset)
                       ELSE k.from_offset END,
    until_offset = greatest(k.until_offset, excluded.until_offset),
    backfilled_from = least(k.backfilled_from, excluded.backfilled_from),
    backfilled = k.backfilled + excluded.backfilled,
    records_read = k.records_read + excluded.records_read,
    ranges = k.ranges + excluded.ranges,
    replay_horizon = CASE WHEN :horizon THEN greatest(k.until_offset, excluded.until_offset) ELSE k.replay_horizon END,
    compacted_at = now();

-- name: fold_counts
-- The folded batches' counts, summed into the pipeline's row: what `verify` adds to the batches it still has.
INSERT INTO ledger.compactions AS k (pipeline, through_batch_id, batches, records_read, records_filtered,
                                     replay_delta, rows_written, rows_quarantined, rows_rejected, deletes_folded)
SELECT :pipeline, :through, count(*),
       coalesce(sum(records_read) FILTER (WHERE status = 'committed' AND kind IN ('live', 'backfill')), 0),
       coalesce(sum(records_filtered) FILTER (WHERE status = 'committed' AND kind IN ('live', 'backfill')), 0),
       coalesce(sum(rows_written + rows_quarantined + rows_rejected - records_replaced)
                FILTER (WHERE status = 'committed' AND kind = 'replay'), 0),
       coalesce(sum(rows_written) FILTER (WHERE status = 'committed'), 0),
       coalesce(sum(rows_quarantined) FILTER (WHERE status = 'committed'), 0),
       coalesce(sum(rows_rejected) FILTER (WHERE status = 'committed'), 0),
       :deletes
FROM ledger.batches WHERE pipeline = :pipeline AND batch_id > :folded AND batch_id <= :through
ON CONFLICT (pipeline) DO UPDATE
SET through_batch_id = excluded.through_batch_id, batches = k.batches + excluded.batches,
    records_read = k.records_read + excluded.records_read,
    records_filtered = k.records_filtered + excluded.records_filtered,
    replay_delta = k.replay_delta + excluded.replay_delta, rows_written = k.rows_written + excluded.rows_written,
    rows_quarantined = k.rows_quarantined + excluded.rows_quarantined,
    rows_rejected = k.rows_rejected + excluded.rows_rejected,
    deletes_folded = k.deletes_folded + excluded.deletes_folded, compacted_at = now();

-- name: delete_folded
-- The folded batches leave the ledger, their ranges and staged reads with them.
DELETE FROM ledger.staged_reads s USING ledger.batches b
WHERE s.batch_id = b.batch_id AND b.pipeline = :pipeline AND b.batch_id > :folded AND b.batch_id <= :through;
DELETE FROM ledger.batch_ranges WHERE pipeline = :pipeline AND batch_id > :folded AND batch_id <= :through;
DELETE FROM ledger.batches WHERE pipeline = :pipeline AND batch_id > :folded AND batch_id <= :through;

-- name: fold_deletes
-- Change pipelines: deletes delivered by folded batches are forgotten (the replay horizon keeps replays
-- from bringing their keys back). Only once no backfill can reach the pipeline's offsets (backfill_gaps, checked
-- by commit/modes/upsert.py): a backfill's change of a key loses to any change of it delivered, and of a
-- deleted key only its delete says there was one.
DELETE FROM ledger_deletes.{deletes} WHERE _batch_id <= :through;

-- name: backfill_gaps
-- Offsets a backfill may still deliver, per partition of the pipeline: those of [log start, start offset)
-- that no committed batch delivered, folded or not (the log start as the last plan saw it, or 0). Offsets
-- compacted before migration 015 whose delivery the ledger no longer knows are refused to backfills, so
-- they are no gap. A planned or staged backfill's ranges are a gap until it commits; a staged one's even
-- where retention has passed them since (its records are in its staging table, Kafka no longer has them).
SELECT c.topic, c.partition, lower(g) AS from_offset, upper(g) AS until_offset
FROM ledger.cursors c
LEFT JOIN ledger.end_offsets e USING (pipeline, topic, partition)
LEFT JOIN ledger.checkpoints k USING (pipeline, topic, partition)
CROSS JOIN LATERAL unnest(
    (int8multirange(int8range(least(coalesce(e.log_start, 0), c.start_offset), c.start_offset))
     - coalesce(k.backfilled, int8multirange()) - coalesce(k.backfilled_unknown, int8multirange())
     - coalesce((SELECT range_agg(int8range(r.from_offset, r.until_offset)) FROM ledger.batch_ranges r
                 WHERE r.pipeline = c.pipeline AND r.topic = c.topic AND r.partition = c.partition
                   AND r.committed AND r.kind = 'backfill'), int8multirange()))
    + coalesce((SELECT range_agg(int8range(r.from_offset, r.until_offset)) FROM ledger.batch_ranges r
                JOIN ledger.batches b USING (batch_id)
                WHERE r.pipeline = c.pipeline AND r.topic = c.topic AND r.partition = c.partition
                  AND r.kind = 'backfill' AND b.status = 'staged'), int8multirange())) AS g
WHERE c.pipeline = :pipeline
ORDER BY c.topic, c.partition, lower(g);

-- name: deletes_forgotten
-- How many deletes compaction forgot (change pipelines; ledger.compactions.deletes_folded): while any were,
-- a backfill could bring one of their keys back, and the ledger cannot tell which.
SELECT coalesce((SELECT deletes_folded FROM ledger.compactions WHERE pipeline = :pipeline), 0);

-- name: fold_contributions
-- Aggregate pipelines: the folded batches' contributions merge into one per group, under :through.
CREATE TEMPORARY TABLE lb_folded ON COMMIT DROP AS
SELECT {key}, {measures_agg} FROM ledger_aggregates.{contributions} c WHERE c._batch_id <= :through GROUP BY {key};
DELETE FROM ledger_aggregates.{contributions} WHERE _batch_id <= :through;
INSERT INTO ledger_aggregates.{contributions} (_batch_id, {columns}) SELECT :through, {columns} FROM lb_folded;
DROP TABLE lb_folded;

-- name: purge_quarantine
-- Quarantine retention: bad records quarantined before :before go, counted in ledger.compactions.
WITH gone AS (
    DELETE FROM ledger.quarantine WHERE pipeline = :pipeline AND quarantined_at < :before RETURNING batch_id
), counted AS (
    INSERT INTO ledger.compactions AS k (pipeline, through_batch_id, quarantine_purged, purged_at, purged_through)
    SELECT :pipeline, 0, count(*), now(), coalesce(max(batch_id), 0) FROM gone
    ON CONFLICT (pipeline) DO UPDATE
    SET quarantine_purged = k.quarantine_purged + excluded.quarantine_purged, purged_at = excluded.purged_at,
        purged_through = greatest(k.purged_through, excluded.purged_through)
)
SELECT count(*) AS purged FROM gone;

-- name: replay_horizon
SELECT replay_horizon FROM ledger.checkpoints
WHERE pipeline = :pipeline AND topic = :topic AND partition = :partition;

-- name: checked_in_detail_from
-- `verify --deep` reads the batches above this again: those below were compacted or had bad records purged.
SELECT coalesce((SELECT greatest(through_batch_id, purged_through) + 1 FROM ledger.compactions
                 WHERE pipeline = :pipeline), 0);

-- name: vacuum_ledger
-- After a fold (outside a transaction): the deleted rows' space is reused at once, whatever autovacuum's
-- schedule (or with autovacuum off). A login that does not own the tables gets a warning, not an error.
VACUUM (ANALYZE) ledger.batches, ledger.batch_ranges, ledger.staged_reads, ledger.checkpoints, ledger.compactions,
    ledger.quarantine;
