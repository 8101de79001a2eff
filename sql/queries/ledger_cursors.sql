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
-- How many offsets of [from, until) of one partition committed live or backfill batches delivered, those
-- folded into its checkpoint included (migration 014: its live span less the lost or skipped offsets inside
-- it; migration 015: exactly the offsets folded backfills delivered), and how many lie in offsets folded
-- before 015 whose delivery the ledger no longer knows (`unknown`).
WITH asked AS (SELECT int8multirange(int8range(CAST(:from_offset AS bigint), CAST(:until_offset AS bigint))) AS m),
k AS (SELECT * FROM ledger.checkpoints WHERE pipeline = :pipeline AND topic = :topic AND partition = :partition)
SELECT CAST(coalesce((SELECT sum(r.sign * greatest(0, least(r.until_offset, :until_offset) - greatest(r.from_offset, :from_offset)))
                 FROM (SELECT 1 AS sign, from_offset, until_offset FROM ledger.batch_ranges
                       WHERE pipeline = :pipeline AND topic = :topic AND partition = :partition AND committed
                         AND kind IN ('live', 'backfill')
                       UNION ALL
                       SELECT 1, from_offset, until_offset FROM k
                       UNION ALL
                       SELECT -1, l.from_offset, l.until_offset FROM ledger.lost_ranges l JOIN k USING (pipeline, topic, partition)
                       WHERE l.from_offset >= k.from_offset AND l.until_offset <= k.until_offset) r), 0)
       + coalesce((SELECT sum(upper(s) - lower(s)) FROM k, asked, unnest(k.backfilled * asked.m) s), 0) AS bigint)
       AS overlap,
       CAST(coalesce((SELECT sum(upper(s) - lower(s)) FROM k, asked, unnest(k.backfilled_unknown * asked.m) s), 0) AS bigint)
       AS unknown;

-- name: insert_lost_range
INSERT INTO ledger.lost_ranges (pipeline, topic, partition, from_offset, until_offset, acknowledged_by, reason)
VALUES (:pipeline, :topic, :partition, :from_offset, :until_offset, :acknowledged_by, :reason);

-- name: skip_lost_cursor
UPDATE ledger.cursors SET next_offset = :until_offset, updated_at = now()
WHERE pipeline = :pipeline AND topic = :topic AND partition = :partition AND next_offset = :from_offset;
