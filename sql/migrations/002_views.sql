-- Inspection views for operators.
CREATE OR REPLACE VIEW ledger.pipeline_progress AS
SELECT c.pipeline,
       count(*)                         AS partitions,
       sum(c.next_offset - c.start_offset) AS offsets_delivered,
       max(c.updated_at)                AS last_commit_at,
       max(c.last_batch_id)             AS last_batch_id
FROM ledger.cursors c
GROUP BY c.pipeline;

CREATE OR REPLACE VIEW ledger.recent_batches AS
SELECT b.batch_id, b.pipeline, b.kind, b.status, b.attempt, b.records_read, b.rows_written,
       b.rows_quarantined, b.created_at, b.committed_at,
       b.committed_at - b.created_at AS duration, b.error,
       (SELECT count(*) FROM ledger.batch_ranges r WHERE r.batch_id = b.batch_id) AS ranges
FROM ledger.batches b
ORDER BY b.batch_id DESC;
