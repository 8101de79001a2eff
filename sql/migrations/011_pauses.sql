-- Pipelines an operator holds still (issue #23, `ledgerbatch pause` / `resume`; ops/pause.py): the planner
-- plans no new batch of a paused pipeline (an open one may finish) and its event-driven trigger stays quiet.
-- Kept in the ledger, so the CLI and Airflow agree; one row per pause, the open one without resumed_at.
CREATE TABLE IF NOT EXISTS ledger.pauses (
    pause_id   bigserial PRIMARY KEY,
    pipeline   text NOT NULL,
    paused_by  text NOT NULL CHECK (btrim(paused_by) <> ''),
    reason     text NOT NULL CHECK (btrim(reason) <> ''),
    paused_at  timestamptz NOT NULL DEFAULT now(),
    resumed_by text CHECK (btrim(resumed_by) <> ''),
    resumed_at timestamptz,
    CHECK ((resumed_by IS NULL) = (resumed_at IS NULL))
);
CREATE UNIQUE INDEX IF NOT EXISTS pauses_one_open ON ledger.pauses (pipeline) WHERE resumed_at IS NULL;
GRANT SELECT ON ledger.pauses TO ledgerbatch_inspector;
GRANT SELECT, INSERT, UPDATE ON ledger.pauses TO ledgerbatch_writer;
GRANT USAGE ON SEQUENCE ledger.pauses_pause_id_seq TO ledgerbatch_writer;

-- pipeline_progress (004) gains who paused the pipeline, when and why (NULL: running).
CREATE OR REPLACE VIEW ledger.pipeline_progress AS
SELECT c.pipeline,
       count(*)                         AS partitions,
       sum(c.next_offset - c.start_offset) AS offsets_delivered,
       max(c.updated_at)                AS last_commit_at,
       max(c.last_batch_id)             AS last_batch_id,
       sum(e.end_offset - c.next_offset) AS lag,
       min(e.observed_at)               AS lag_observed_at,
       p.paused_by, p.paused_at, p.reason AS pause_reason
FROM ledger.cursors c
LEFT JOIN ledger.end_offsets e USING (pipeline, topic, partition)
LEFT JOIN ledger.pauses p ON p.pipeline = c.pipeline AND p.resumed_at IS NULL
GROUP BY c.pipeline, p.paused_by, p.paused_at, p.reason;
