-- Pauses of pipelines, and waits for batch.min_records (plugins/ledgerbatch/ledger/pauses.py; migrations 011, 013).

-- name: current_pause
SELECT paused_by, reason, paused_at, extract(epoch FROM now() - paused_at)::float AS age_s
FROM ledger.pauses WHERE pipeline = :pipeline AND resumed_at IS NULL;

-- name: insert_pause
INSERT INTO ledger.pauses (pipeline, paused_by, reason) VALUES (:pipeline, :by, :reason);

-- name: end_pause
UPDATE ledger.pauses SET resumed_by = :by, resumed_at = now()
WHERE pipeline = :pipeline AND resumed_at IS NULL
RETURNING paused_by, reason, paused_at;

-- name: wait_age
-- How long the planner has held this pipeline's pending offsets back (batch.min_records), starting now
-- if it was not waiting.
WITH started AS (
    INSERT INTO ledger.waits (pipeline) VALUES (:pipeline) ON CONFLICT (pipeline) DO NOTHING RETURNING since
)
SELECT extract(epoch FROM now() - coalesce((SELECT since FROM started),
                                           (SELECT since FROM ledger.waits WHERE pipeline = :pipeline)))::float;

-- name: end_wait
DELETE FROM ledger.waits WHERE pipeline = :pipeline;
