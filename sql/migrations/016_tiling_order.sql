-- invariant_violations (014) read a checkpoint whose live span is empty (a partition that had only
-- backfills when it was compacted: [start, start)) as a tile: the live batch starting there tied with it, or
-- (after `offsets --to-offset` moved the start below it) overlapped it, a false tiling violation. An empty
-- span holds no offsets, so it is no tile; ties order by where tiles end too. The view is 014's otherwise.
CREATE OR REPLACE VIEW ledger.invariant_violations AS
WITH tiles AS (
    SELECT pipeline, topic, partition, from_offset, until_offset FROM ledger.batch_ranges
    WHERE kind = 'live' AND committed
    UNION ALL
    SELECT pipeline, topic, partition, from_offset, until_offset FROM ledger.checkpoints
    WHERE until_offset > from_offset
    UNION ALL
    SELECT l.pipeline, l.topic, l.partition, l.from_offset, l.until_offset FROM ledger.lost_ranges l
    WHERE NOT EXISTS (SELECT 1 FROM ledger.checkpoints k
                      WHERE k.pipeline = l.pipeline AND k.topic = l.topic AND k.partition = l.partition
                        AND l.from_offset >= k.from_offset AND l.until_offset <= k.until_offset)
), ordered AS (
    SELECT t.*, lag(t.until_offset) OVER (PARTITION BY t.pipeline, t.topic, t.partition
                                          ORDER BY t.from_offset, t.until_offset) AS previous_until
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
LEFT JOIN ledger.compactions k ON k.pipeline = c.pipeline
WHERE c.last_batch_id IS NOT NULL AND (b.batch_id IS NOT NULL OR c.last_batch_id > coalesce(k.through_batch_id, 0))
  AND (b.batch_id IS NULL OR b.status <> 'committed' OR b.kind <> 'live' OR b.pipeline <> c.pipeline)
UNION ALL
SELECT k.pipeline, 'compaction',
       k.topic || '[' || k.partition || ']: checkpoint [' || k.from_offset || ', ' || k.until_offset || ') has no cursor'
FROM ledger.checkpoints k LEFT JOIN ledger.cursors c USING (pipeline, topic, partition)
WHERE c.pipeline IS NULL
UNION ALL
-- (No percent signs in this file: migrations run through the driver's parameter style.)
-- pg_tables, not information_schema: the read-only inspector role must see tables it cannot read.
SELECT b.pipeline, 'staging',
       'orphan staging table ledger_staging.' || t.tablename || ' (batch ' || coalesce(b.status, 'unknown') || ')'
FROM pg_catalog.pg_tables t
LEFT JOIN ledger.batches b ON b.batch_id = substring(t.tablename FROM '^b(\d+)_a\d+(_bad)?$')::bigint
WHERE t.schemaname = 'ledger_staging' AND (b.batch_id IS NULL OR b.status IN ('committed', 'abandoned'));
