-- Rows the target refuses at publish (issue #22, errors.on_reject: quarantine; commit/rejects.py): staged as
-- written (or as deletes), they are quarantined by the commit with the server's SQLSTATE, constraint and
-- message. read = written + deleted + skipped + filtered + quarantined + rejected.
ALTER TABLE ledger.batches
    ADD COLUMN IF NOT EXISTS rows_rejected bigint NOT NULL DEFAULT 0 CHECK (rows_rejected >= 0);
ALTER TABLE ledger.batch_ranges
    ADD COLUMN IF NOT EXISTS records_rejected bigint NOT NULL DEFAULT 0 CHECK (records_rejected >= 0);

ALTER TABLE ledger.batches DROP CONSTRAINT IF EXISTS batches_counts_add_up;
ALTER TABLE ledger.batches ADD CONSTRAINT batches_counts_add_up
    CHECK (status NOT IN ('staged', 'committed')
           OR (staging_table IS NOT NULL
               AND records_read = rows_written + rows_deleted + records_skipped + records_filtered + rows_quarantined
                                  + rows_rejected));

-- NULL for records that did not decode or convert; set for rows the target refused.
ALTER TABLE ledger.quarantine
    ADD COLUMN IF NOT EXISTS sqlstate        text,
    ADD COLUMN IF NOT EXISTS constraint_name text;

-- recent_batches (007) gains rows_rejected at the end.
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
       b.records_filtered, b.groups_written, b.rows_deleted, b.records_skipped, b.spec_version, b.rows_rejected
FROM ledger.batches b
ORDER BY b.batch_id DESC;
