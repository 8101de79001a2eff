-- Checkpoints keep exactly what folded backfills delivered (issue #49; ledger/compaction.py, ledger_compact.sql).
-- Migration 014 kept a folded backfill only as `backfilled_from` (its lowest offset), and the ledger counted
-- every offset from there to the pipeline's start as delivered: a gap no batch delivered could never be
-- backfilled, and a backfill of it committed after the compaction was counted twice. From here on a
-- checkpoint keeps the offsets folded backfills delivered as a set of ranges, so "was offset o delivered"
-- has the same answer after folding as before it.

ALTER TABLE ledger.checkpoints
    -- The offsets folded backfills delivered, exactly (adjacent backfills merge into one range).
    ADD COLUMN IF NOT EXISTS backfilled int8multirange NOT NULL DEFAULT '{}',
    -- Offsets folded before this migration between backfilled_from and the live span: some of them a
    -- backfill delivered, the ledger no longer knows which. They count as delivered, as they did, and a
    -- backfill touching them is refused (it could deliver an offset twice), saying why.
    ADD COLUMN IF NOT EXISTS backfilled_unknown int8multirange NOT NULL DEFAULT '{}';

COMMENT ON COLUMN ledger.checkpoints.backfilled_from IS
    'the lowest offset a folded backfill delivered (informational: `backfilled` holds what they delivered)';

-- A checkpoint folded under 014: [backfilled_from, from_offset) is unknown, less what backfills still in the
-- ledger delivered (those are known, and counted by their own ranges).
UPDATE ledger.checkpoints k
SET backfilled_unknown = int8multirange(int8range(k.backfilled_from, k.from_offset))
    - coalesce((SELECT range_agg(int8range(r.from_offset, r.until_offset)) FROM ledger.batch_ranges r
                WHERE r.pipeline = k.pipeline AND r.topic = k.topic AND r.partition = k.partition
                  AND r.committed AND r.kind = 'backfill'), int8multirange())
WHERE k.backfilled_from IS NOT NULL AND k.backfilled_from < k.from_offset
  AND k.backfilled = int8multirange() AND k.backfilled_unknown = int8multirange();
