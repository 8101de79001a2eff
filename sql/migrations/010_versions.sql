-- Versioned upserts (issue #22, target.version; commit/modes/versioned.py): a change older than its key's
-- newest delivered change is superseded, counted and not applied.
-- read = written + deleted + skipped + filtered + quarantined + rejected + superseded.
ALTER TABLE ledger.batches
    ADD COLUMN IF NOT EXISTS records_superseded bigint NOT NULL DEFAULT 0 CHECK (records_superseded >= 0);
ALTER TABLE ledger.batch_ranges
    ADD COLUMN IF NOT EXISTS records_superseded bigint NOT NULL DEFAULT 0 CHECK (records_superseded >= 0);

ALTER TABLE ledger.batches DROP CONSTRAINT IF EXISTS batches_counts_add_up;
ALTER TABLE ledger.batches ADD CONSTRAINT batches_counts_add_up
    CHECK (status NOT IN ('staged', 'committed')
           OR (staging_table IS NOT NULL
               AND records_read = rows_written + rows_deleted + records_skipped + records_filtered + rows_quarantined
                                  + rows_rejected + records_superseded));

-- recent_batches (009) gains records_superseded at the end.
CREATE OR REPLACE VIEW ledger.recent_batches AS
SELECT b.batch_id, b.pipeline, b.kind, b.status, b.attempt, b.records_read, b.rows_written,
       b.rows_quarantined, b.created_at, b.committed_at,
       b.committed_at - b.created_at AS duration, b.error,
       (SELECT count(*) FROM ledger.batch_ranges r WHERE r.batch_id = b.batch_id) AS ranges,
       (SELECT coalesce(sum(r.until_offset - r.from_offset), 0) FROM ledger.batch_ranges r
        WHERE r.batch_id = b.batch_id) AS offsets,
       b.staged_at,
       b.staged_at - b.created_at AS planned_to_staged,
       b.committed_at - b.staged_at AS staged_to_committed,
       round(b.records_read / nullif(extract(epoch FROM b.committed_at - b.created_at), 0))::bigint
           AS records_per_second,
       b.records_filtered, b.groups_written, b.rows_deleted, b.records_skipped, b.spec_version, b.rows_rejected,
       b.records_superseded
FROM ledger.batches b
ORDER BY b.batch_id DESC;
