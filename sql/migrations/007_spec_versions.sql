-- Spec versions (issue #11): every batch records the version of the pipeline spec it was planned with,
-- a hash of the spec's canonical text, and the text of every version is kept here. A batch resumed
-- under another version fails loudly instead of mixing two specs in one batch.
CREATE TABLE IF NOT EXISTS ledger.spec_versions (
    pipeline   text        NOT NULL,
    version    text        NOT NULL,
    spec_text  text        NOT NULL,
    first_seen timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pipeline, version)
);
GRANT SELECT ON ledger.spec_versions TO ledgerbatch_inspector;
GRANT SELECT, INSERT ON ledger.spec_versions TO ledgerbatch_writer;

-- NULL for batches planned before this migration.
ALTER TABLE ledger.batches ADD COLUMN IF NOT EXISTS spec_version text;

-- recent_batches (004) gains the counts of 005 and 006 and the spec version at the end (one view
-- definition for the three migrations).
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
       b.records_filtered, b.groups_written, b.rows_deleted, b.records_skipped, b.spec_version
FROM ledger.batches b
ORDER BY b.batch_id DESC;
