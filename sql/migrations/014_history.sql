-- Bounded history (issue #42; plugins/ledgerbatch/ledger/compaction.py, `ledgerbatch compact`): committed
-- batches older than a time fold into one checkpoint per partition and one row of summed counts per
-- pipeline, so the ledger stops growing with the number of batches and `verify` still proves what it did.

-- What the folded live ranges delivered, per partition: [from_offset, until_offset) tiles the log from the
-- cursor's start as the folded ranges did (lost and skipped ranges inside it are kept in ledger.lost_ranges).
CREATE TABLE IF NOT EXISTS ledger.checkpoints (
    pipeline        text        NOT NULL,
    topic           text        NOT NULL,
    partition       integer     NOT NULL CHECK (partition >= 0),
    from_offset     bigint      NOT NULL CHECK (from_offset >= 0),
    until_offset    bigint      NOT NULL,
    backfilled_from bigint CHECK (backfilled_from >= 0),  -- the lowest offset a folded backfill delivered
    records_read    bigint      NOT NULL CHECK (records_read >= 0),  -- by the folded live ranges
    ranges          bigint      NOT NULL CHECK (ranges >= 0),        -- live ranges folded
    -- Replays must start at or after this offset: the deletes (change pipelines) or the per-batch
    -- contributions (aggregate pipelines) that would let them replace older offsets were folded.
    replay_horizon  bigint,
    compacted_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pipeline, topic, partition),
    CHECK (from_offset <= until_offset),
    CHECK (records_read <= until_offset - from_offset)
);

-- Per pipeline: every batch up to through_batch_id is folded; the sums are what `verify` reconciles with.
CREATE TABLE IF NOT EXISTS ledger.compactions (
    pipeline          text        PRIMARY KEY,
    through_batch_id  bigint      NOT NULL,
    batches           bigint      NOT NULL DEFAULT 0,
    records_read      bigint      NOT NULL DEFAULT 0,  -- live and backfill batches
    records_filtered  bigint      NOT NULL DEFAULT 0,  -- live and backfill batches
    replay_delta      bigint      NOT NULL DEFAULT 0,  -- replays: written + quarantined + refused - replaced
    rows_written      bigint      NOT NULL DEFAULT 0,  -- every kind, for `status`
    rows_quarantined  bigint      NOT NULL DEFAULT 0,
    rows_rejected     bigint      NOT NULL DEFAULT 0,
    deletes_folded    bigint      NOT NULL DEFAULT 0,  -- ledger_deletes rows forgotten (change pipelines)
    compacted_at      timestamptz NOT NULL DEFAULT now(),
    -- Quarantine retention (`ledgerbatch quarantine purge`, errors.quarantine_retention): rows dropped, counted.
    quarantine_purged bigint      NOT NULL DEFAULT 0,
    purged_at         timestamptz,
    purged_through    bigint      NOT NULL DEFAULT 0   -- the newest batch whose bad records were purged
);

-- Folded batches leave the ledger; what still names one (a cursor's last batch, a quarantined record)
-- keeps the id, which `verify` accepts up to through_batch_id.
ALTER TABLE ledger.cursors DROP CONSTRAINT IF EXISTS cursors_last_batch_id_fkey;
ALTER TABLE ledger.quarantine DROP CONSTRAINT IF EXISTS quarantine_batch_id_fkey;
CREATE INDEX IF NOT EXISTS quarantine_age ON ledger.quarantine (pipeline, quarantined_at);
CREATE INDEX IF NOT EXISTS batches_pipeline_age ON ledger.batches (pipeline, committed_at);

-- invariant_violations (004) reads checkpoints as tiles and compacted batches as committed.
CREATE OR REPLACE VIEW ledger.invariant_violations AS
WITH tiles AS (
    SELECT pipeline, topic, partition, from_offset, until_offset FROM ledger.batch_ranges
    WHERE kind = 'live' AND committed
    UNION ALL
    SELECT pipeline, topic, partition, from_offset, until_offset FROM ledger.checkpoints
    UNION ALL
    SELECT l.pipeline, l.topic, l.partition, l.from_offset, l.until_offset FROM ledger.lost_ranges l
    WHERE NOT EXISTS (SELECT 1 FROM ledger.checkpoints k
                      WHERE k.pipeline = l.pipeline AND k.topic = l.topic AND k.partition = l.partition
                        AND l.from_offset >= k.from_offset AND l.until_offset <= k.until_offset)
), ordered AS (
    SELECT t.*, lag(t.until_offset) OVER (PARTITION BY t.pipeline, t.topic, t.partition
                                          ORDER BY t.from_offset) AS previous_until
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

GRANT SELECT ON ledger.checkpoints, ledger.compactions TO ledgerbatch_inspector;
-- `run --follow` compacts (ledger.compact_after) and purges (errors.quarantine_retention) as the writer.
GRANT SELECT, INSERT, UPDATE, DELETE ON ledger.checkpoints, ledger.compactions TO ledgerbatch_writer;
GRANT DELETE ON ledger.batches, ledger.batch_ranges, ledger.staged_reads TO ledgerbatch_writer;
GRANT DELETE ON ALL TABLES IN SCHEMA ledger_deletes TO ledgerbatch_writer;
