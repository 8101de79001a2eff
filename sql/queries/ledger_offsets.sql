-- Cursors moved on purpose (plugins/ledgerbatch/ops/offsets.py; migration 012).

-- name: insert_offset_move
INSERT INTO ledger.offset_moves (pipeline, topic, partition, from_offset, to_offset, moved_by, reason, request)
VALUES (:pipeline, :topic, :partition, :from_offset, :to_offset, :by, :reason, :request)
RETURNING move_id;

-- name: insert_skipped_range
INSERT INTO ledger.lost_ranges (pipeline, topic, partition, from_offset, until_offset, acknowledged_by, reason,
                                kind, move_id)
VALUES (:pipeline, :topic, :partition, :from_offset, :until_offset, :by, :reason, 'skipped', :move_id);

-- name: delivered_between
-- Offsets of [from, until) of one partition that are not merely skipped: delivered by committed live or
-- backfill batches, or lost. A move back over them would deliver them twice (or pretend they were not lost).
SELECT coalesce(sum(greatest(0, least(r.until_offset, :until_offset) - greatest(r.from_offset, :from_offset))), 0)
       AS offsets
FROM (SELECT from_offset, until_offset FROM ledger.batch_ranges
      WHERE pipeline = :pipeline AND topic = :topic AND partition = :partition AND committed
        AND kind IN ('live', 'backfill')
      UNION ALL
      SELECT from_offset, until_offset FROM ledger.lost_ranges
      WHERE pipeline = :pipeline AND topic = :topic AND partition = :partition AND kind = 'lost'
      UNION ALL  -- compacted (migration 014): skipped offsets inside count too, so a move back over it is refused
      SELECT from_offset, until_offset FROM ledger.checkpoints
      WHERE pipeline = :pipeline AND topic = :topic AND partition = :partition
      UNION ALL  -- and what compacted backfills delivered (migration 015)
      SELECT lower(s), upper(s) FROM ledger.checkpoints k, unnest(k.backfilled + k.backfilled_unknown) s
      WHERE k.pipeline = :pipeline AND k.topic = :topic AND k.partition = :partition) r;

-- name: unskip_from
-- A move back to :to_offset: skipped ranges at or after it are no longer skipped; one across it ends there.
DELETE FROM ledger.lost_ranges
WHERE pipeline = :pipeline AND topic = :topic AND partition = :partition AND kind = 'skipped'
  AND from_offset >= :to_offset;
UPDATE ledger.lost_ranges SET until_offset = :to_offset
WHERE pipeline = :pipeline AND topic = :topic AND partition = :partition AND kind = 'skipped'
  AND from_offset < :to_offset AND until_offset > :to_offset;

-- name: move_cursor
-- Compare-and-set, as a commit moves it; a move back below where the pipeline started moves its start too.
UPDATE ledger.cursors SET next_offset = :to_offset, start_offset = least(start_offset, :to_offset), updated_at = now()
WHERE pipeline = :pipeline AND topic = :topic AND partition = :partition AND next_offset = :from_offset;

-- name: recent_offset_moves
SELECT move_id, topic, partition, from_offset, to_offset, moved_by, reason, request, moved_at
FROM ledger.offset_moves WHERE pipeline = :pipeline ORDER BY move_id DESC LIMIT :limit;
