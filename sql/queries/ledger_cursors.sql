-- Cursors and what Kafka said: compare-and-set moves, end offsets, replay classification, lost
-- ranges. Run only by plugins/ledgerbatch/ledger/cursors.py. Bind parameters are :name.

-- name: get_cursors
SELECT topic, partition, next_offset FROM ledger.cursors WHERE pipeline = :pipeline;

-- name: cursor_batches
SELECT topic, partition, last_batch_id FROM ledger.cursors WHERE pipeline = :pipeline;

-- name: init_cursor
INSERT INTO ledger.cursors (pipeline, topic, partition, start_offset, next_offset)
VALUES (:pipeline, :topic, :partition, :offset, :offset)
ON CONFLICT (pipeline, topic, partition) DO NOTHING;

-- name: advance_cursor
UPDATE ledger.cursors
SET next_offset = :until_offset, last_batch_id = :batch_id, updated_at = now()
WHERE pipeline = :pipeline AND topic = :topic AND partition = :partition AND next_offset = :from_offset;

-- name: record_end_offset
-- Written only when the offsets moved, so an idle follower planning every second writes nothing;
-- observed_at is when these offsets were first seen.
INSERT INTO ledger.end_offsets (pipeline, topic, partition, log_start, end_offset, observed_at)
VALUES (:pipeline, :topic, :partition, :log_start, :end_offset, now())
ON CONFLICT (pipeline, topic, partition) DO UPDATE
SET log_start = excluded.log_start, end_offset = excluded.end_offset, observed_at = excluded.observed_at
WHERE (ledger.end_offsets.log_start, ledger.end_offsets.end_offset) IS DISTINCT FROM (excluded.log_start, excluded.end_offset);

-- name: cursor_of
SELECT start_offset, next_offset FROM ledger.cursors WHERE pipeline = :pipeline AND topic = :topic AND partition = :partition;

-- name: delivered_overlap
-- How many offsets of [from, until) of one partition committed live or backfill batches delivered.
SELECT coalesce(sum(greatest(0, least(r.until_offset, :until_offset) - greatest(r.from_offset, :from_offset))), 0) AS overlap
FROM ledger.batch_ranges r
WHERE r.pipeline = :pipeline AND r.topic = :topic AND r.partition = :partition AND r.committed
  AND r.kind IN ('live', 'backfill');

-- name: insert_lost_range
INSERT INTO ledger.lost_ranges (pipeline, topic, partition, from_offset, until_offset, acknowledged_by, reason)
VALUES (:pipeline, :topic, :partition, :from_offset, :until_offset, :acknowledged_by, :reason);

-- name: skip_lost_cursor
UPDATE ledger.cursors SET next_offset = :until_offset, updated_at = now()
WHERE pipeline = :pipeline AND topic = :topic AND partition = :partition AND next_offset = :from_offset;
