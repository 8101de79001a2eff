-- Roles do only their job (issue #51; docs/operations.md "Database roles").
--   ledgerbatch_stager     executors: COPY into the staging tables the driver grants it, and their counts in
--                          ledger.staged_reads; nothing else in the ledger.
--   ledgerbatch_writer     plans, stages, commits, replays and abandons; it may no longer delete committed
--                          batches or their ranges, change a committed batch or range, move a cursor's start,
--                          insert lost or skipped ranges, write checkpoints or compactions, or delete a
--                          quarantined record that no replay or backfill being committed replaces.
--   ledgerbatch_admin      a writer that also compacts, purges the quarantine, moves offsets and
--                          acknowledges losses.
--   ledgerbatch_inspector  reads the ledger, but not quarantined records' raw key and value (bytes of bad
--                          records, the JSON of rows the target refused): those are the target's data, for
--                          roles that may read the target (the writer and admin; grant others by column).
-- Plain grants say what they can: which tables and columns. "Not a committed row" and "only a row a replay
-- replaces" depend on the row, which grants cannot see. Row-level security could, but it would also filter the
-- writer's SELECT ... FOR UPDATE of committed batches (a commit task retried after its commit must see it),
-- so three small triggers refuse those changes instead: they run with the caller's rights (no SECURITY
-- DEFINER; a fixed search_path, so a caller's own functions cannot stand in for pg_catalog's), the writer
-- cannot disable them (only the owner can), and an admin or the owner passes them.
-- (No percent signs in this file: migrations run through the driver's parameter style.)
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'ledgerbatch_admin') THEN
        CREATE ROLE ledgerbatch_admin NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'ledgerbatch_stager') THEN
        CREATE ROLE ledgerbatch_stager NOLOGIN;
    END IF;
END
$$;
GRANT ledgerbatch_writer TO ledgerbatch_admin;

-- Executors: the schemas, and what their tasks record per range. Each staging table is granted to the stager
-- by the driver that creates it (sql/queries/staging.sql: grant_staging) and revoked before an append commit
-- makes it a partition of the target (mode_append.sql: attach_partition).
GRANT USAGE ON SCHEMA ledger, ledger_staging TO ledgerbatch_stager;
GRANT SELECT, INSERT, UPDATE (records, bad) ON ledger.staged_reads TO ledgerbatch_stager;  -- ON CONFLICT reads them

-- Compaction folds batches, ranges, staged reads (the writer keeps DELETE there: a commit forgets its own)
-- and per-pipeline sums into checkpoints; purge counts into compactions.
REVOKE DELETE ON ledger.batches, ledger.batch_ranges FROM ledgerbatch_writer;
REVOKE INSERT, UPDATE, DELETE ON ledger.checkpoints, ledger.compactions FROM ledgerbatch_writer;
GRANT DELETE ON ledger.batches, ledger.batch_ranges TO ledgerbatch_admin;
GRANT INSERT, UPDATE, DELETE ON ledger.checkpoints, ledger.compactions TO ledgerbatch_admin;
-- Offset moves and acknowledged losses: the ranges skipped or lost, the move, and a cursor's start.
REVOKE INSERT, UPDATE, DELETE ON ledger.lost_ranges FROM ledgerbatch_writer;
REVOKE INSERT, UPDATE ON ledger.offset_moves FROM ledgerbatch_writer;
GRANT INSERT, UPDATE, DELETE ON ledger.lost_ranges TO ledgerbatch_admin;
GRANT INSERT ON ledger.offset_moves TO ledgerbatch_admin;
REVOKE UPDATE ON ledger.cursors FROM ledgerbatch_writer;
GRANT UPDATE (next_offset, last_batch_id, updated_at) ON ledger.cursors TO ledgerbatch_writer;  -- a commit
GRANT UPDATE ON ledger.cursors TO ledgerbatch_admin;

-- The inspector: every column of the quarantine but the record's own bytes.
REVOKE SELECT ON ledger.quarantine FROM ledgerbatch_inspector;
GRANT SELECT (batch_id, pipeline, topic, partition, "offset", error, quarantined_at, sqlstate, constraint_name)
    ON ledger.quarantine TO ledgerbatch_inspector;

-- Whether the caller may change what is committed: an admin, or the table's owner (who runs `migrate`).
CREATE OR REPLACE FUNCTION ledger.may_rewrite_history(tbl regclass) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $f$
    SELECT pg_has_role(current_user, 'ledgerbatch_admin', 'USAGE')
        OR pg_has_role(current_user, (SELECT relowner FROM pg_class WHERE oid = tbl), 'USAGE')
$f$;

-- A batch is inserted planned and, once committed, stays as it was (a batch planned before migration 007 may
-- still be given its spec version).
CREATE OR REPLACE FUNCTION ledger.batches_keep_history() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $f$
DECLARE
    changed ledger.batches;
BEGIN
    IF ledger.may_rewrite_history(TG_RELID) THEN
        RETURN NEW;
    END IF;
    IF TG_OP = 'INSERT' AND NEW.status <> 'planned' THEN
        RAISE EXCEPTION USING MESSAGE = 'permission denied: a batch is inserted planned, not ' || NEW.status,
            ERRCODE = 'insufficient_privilege', HINT = 'only ledgerbatch_admin writes history';
    END IF;
    IF TG_OP = 'UPDATE' AND OLD.status = 'committed' THEN
        changed := NEW;
        IF OLD.spec_version IS NULL THEN
            changed.spec_version := NULL;
        END IF;
        IF changed IS DISTINCT FROM OLD THEN
            RAISE EXCEPTION USING MESSAGE = 'permission denied: batch ' || OLD.batch_id || ' is committed and stays as it was',
                ERRCODE = 'insufficient_privilege', HINT = 'only ledgerbatch_admin writes history';
        END IF;
    END IF;
    RETURN NEW;
END
$f$;
DROP TRIGGER IF EXISTS batches_keep_history ON ledger.batches;
CREATE TRIGGER batches_keep_history BEFORE INSERT OR UPDATE ON ledger.batches
    FOR EACH ROW EXECUTE FUNCTION ledger.batches_keep_history();

-- A range is inserted uncommitted and, once committed, stays as it was.
CREATE OR REPLACE FUNCTION ledger.batch_ranges_keep_history() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $f$
BEGIN
    IF ledger.may_rewrite_history(TG_RELID) THEN
        RETURN NEW;
    END IF;
    IF (TG_OP = 'INSERT' AND NEW.committed) OR (TG_OP = 'UPDATE' AND OLD.committed AND NEW IS DISTINCT FROM OLD) THEN
        RAISE EXCEPTION USING MESSAGE = 'permission denied: a committed range of batch ' || NEW.batch_id || ' stays as it was',
            ERRCODE = 'insufficient_privilege', HINT = 'only ledgerbatch_admin writes history';
    END IF;
    RETURN NEW;
END
$f$;
DROP TRIGGER IF EXISTS batch_ranges_keep_history ON ledger.batch_ranges;
CREATE TRIGGER batch_ranges_keep_history BEFORE INSERT OR UPDATE ON ledger.batch_ranges
    FOR EACH ROW EXECUTE FUNCTION ledger.batch_ranges_keep_history();

-- The writer deletes a quarantined record only when a replay or backfill being committed (staged, its row
-- locked by the commit) delivers its offset again; purging old records is an admin's.
CREATE OR REPLACE FUNCTION ledger.quarantine_keep_history() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $f$
BEGIN
    IF ledger.may_rewrite_history(TG_RELID) OR EXISTS (
        SELECT 1 FROM ledger.batch_ranges r JOIN ledger.batches b USING (batch_id)
        WHERE b.status = 'staged' AND b.kind <> 'live' AND r.pipeline = OLD.pipeline AND r.topic = OLD.topic
          AND r.partition = OLD.partition AND OLD."offset" >= r.from_offset AND OLD."offset" < r.until_offset) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION USING MESSAGE = 'permission denied: quarantined record ' || OLD.topic || '[' || OLD.partition || ']@'
        || OLD."offset" || ' is not replaced by a replay or backfill being committed',
        ERRCODE = 'insufficient_privilege', HINT = 'purging the quarantine is for ledgerbatch_admin';
END
$f$;
DROP TRIGGER IF EXISTS quarantine_keep_history ON ledger.quarantine;
CREATE TRIGGER quarantine_keep_history BEFORE DELETE ON ledger.quarantine
    FOR EACH ROW EXECUTE FUNCTION ledger.quarantine_keep_history();
