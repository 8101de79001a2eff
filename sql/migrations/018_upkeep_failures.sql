-- Upkeep failures in the ledger (issue #49; ops/upkeep_failures.py, `ledgerbatch status`): an upkeep
-- (rollup, compaction, purge, abandon_stranded) that gives way records what failed, when and why here, in
-- whichever process ran it (the follower, the history DAG, a shell), so that `status` run anywhere shows it.
-- The row goes when that upkeep next works. The metric ledgerbatch_upkeep_failures_total counts per process.
CREATE TABLE IF NOT EXISTS ledger.upkeep_failures (
    pipeline        text        NOT NULL,
    upkeep          text        NOT NULL,
    reason          text        NOT NULL,  -- the error's type, SQLSTATE and first line
    sqlstate        text        NOT NULL DEFAULT '',
    failures        integer     NOT NULL CHECK (failures >= 1),  -- in a row, since it last worked
    first_failed_at timestamptz NOT NULL DEFAULT now(),
    failed_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pipeline, upkeep)
);
GRANT SELECT ON ledger.upkeep_failures TO ledgerbatch_inspector;
GRANT SELECT, INSERT, UPDATE, DELETE ON ledger.upkeep_failures TO ledgerbatch_writer;

-- pipeline_progress (011) gains the pipeline's last upkeep failure while it lasts (NULL: none failing): which
-- upkeep, why, when, and how many times in a row.
CREATE OR REPLACE VIEW ledger.pipeline_progress AS
SELECT c.pipeline,
       count(*)                         AS partitions,
       sum(c.next_offset - c.start_offset) AS offsets_delivered,
       max(c.updated_at)                AS last_commit_at,
       max(c.last_batch_id)             AS last_batch_id,
       sum(e.end_offset - c.next_offset) AS lag,
       min(e.observed_at)               AS lag_observed_at,
       p.paused_by, p.paused_at, p.reason AS pause_reason,
       u.upkeep AS upkeep_failing, u.reason AS upkeep_failure, u.failed_at AS upkeep_failed_at,
       u.failures AS upkeep_failures_in_a_row
FROM ledger.cursors c
LEFT JOIN ledger.end_offsets e USING (pipeline, topic, partition)
LEFT JOIN ledger.pauses p ON p.pipeline = c.pipeline AND p.resumed_at IS NULL
LEFT JOIN LATERAL (SELECT f.upkeep, f.reason, f.failed_at, f.failures FROM ledger.upkeep_failures f
                   WHERE f.pipeline = c.pipeline ORDER BY f.failed_at DESC, f.upkeep LIMIT 1) u ON true
GROUP BY c.pipeline, p.paused_by, p.paused_at, p.reason, u.upkeep, u.reason, u.failed_at, u.failures;
