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

-- name: advance_cursors
-- Compare-and-set of every range's cursor from its from_offset to its until_offset, in one statement (parallel
-- arrays): a cursor no longer where the batch began is not moved, and the commit is fenced.
UPDATE ledger.cursors c
SET next_offset = q.until_offset, last_batch_id = :batch_id, updated_at = now()
FROM unnest(CAST(:topics AS text[]), CAST(:partitions AS int[]), CAST(:from_offsets AS bigint[]),
            CAST(:until_offsets AS bigint[])) AS q(topic, partition, from_offset, until_offset)
WHERE c.pipeline = :pipeline AND c.topic = q.topic AND c.partition = q.partition AND c.next_offset = q.from_offset
RETURNING c.topic, c.partition;

-- name: record_end_offsets
-- Every partition's in one statement (parallel arrays; they were one a partition, each plan). Written only
-- when the offsets moved, so an idle follower planning every second writes nothing; observed_at is when
-- these offsets were first seen.
INSERT INTO ledger.end_offsets (pipeline, topic, partition, log_start, end_offset, observed_at)
SELECT :pipeline, e.topic, e.partition, e.log_start, e.end_offset, now()
FROM unnest(CAST(:topics AS text[]), CAST(:partitions AS int[]), CAST(:log_starts AS bigint[]),
            CAST(:end_offsets AS bigint[])) AS e(topic, partition, log_start, end_offset)
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
