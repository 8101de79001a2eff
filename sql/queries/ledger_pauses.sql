-- Pauses of pipelines (plugins/ledgerbatch/ledger/pauses.py; migration 011).

-- name: current_pause
SELECT paused_by, reason, paused_at, extract(epoch FROM now() - paused_at)::float AS age_s
FROM ledger.pauses WHERE pipeline = :pipeline AND resumed_at IS NULL;

-- name: insert_pause
INSERT INTO ledger.pauses (pipeline, paused_by, reason) VALUES (:pipeline, :by, :reason);

-- name: end_pause
UPDATE ledger.pauses SET resumed_by = :by, resumed_at = now()
WHERE pipeline = :pipeline AND resumed_at IS NULL
RETURNING paused_by, reason, paused_at;
