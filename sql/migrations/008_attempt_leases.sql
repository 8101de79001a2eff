-- Attempt leases (issue #26): the process that stages an attempt renews heartbeat_at every few seconds
-- (stage/lease.py). Another runner does not take the batch over while the lease is fresh: it waits for
-- the attempt to finish, or for its lease to lapse (the process died or froze), instead of fencing a live
-- attempt. NULL for attempts begun before this migration (no lease: they may be taken over at once).
ALTER TABLE ledger.batches ADD COLUMN IF NOT EXISTS heartbeat_at timestamptz;

-- Replays (issue #26): the target rows and quarantined records of earlier deliveries a replay's commit removed
-- (append targets), so that `verify` counts what is there now: live and backfill batches add what they read
-- less what they filtered, a replay adds what it wrote and quarantined less what it replaced.
ALTER TABLE ledger.batches ADD COLUMN IF NOT EXISTS records_replaced bigint NOT NULL DEFAULT 0;
