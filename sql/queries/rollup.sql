-- Partition rollup (plugins/ledgerbatch/commit/modes/rollup.py), besides mode_append.sql's
-- create_merged_partition ... attach_merged_partition and target.sql's table_checks / add_check.

-- name: drop_merged_check
-- LIKE ... INCLUDING CONSTRAINTS copies a CHECK the target has NOT VALID as a validated one; the rows the target
-- holds already (which that CHECK never judged) are copied without it, and it comes back NOT VALID after the
-- copy (add_check), as the target has it: a rollup merges the target's rows as they are.
ALTER TABLE {schema}.{merged} DROP CONSTRAINT {constraint};

-- name: rollup_lock
-- One rollup of a target at a time, from taking the target's shape to the swap (a session lock: they are two
-- transactions). Commits never take it; a rollup that finds it taken leaves the merge to the one holding it.
SELECT pg_try_advisory_lock(hashtext('ledgerbatch:rollup:' || :target));

-- name: rollup_unlock
SELECT pg_advisory_unlock(hashtext('ledgerbatch:rollup:' || :target));

-- name: try_target_lock
-- target.sql's target_lock (the same key), without waiting: the rollup polls for it and gives way when a commit
-- waits for one of its locks, so the two never deadlock and a commit is never the one PostgreSQL cancels.
SELECT pg_try_advisory_xact_lock(hashtext('ledgerbatch:target:' || :target));

-- name: create_rollup_template
-- The target's shape in a temporary table, in a short transaction of its own: LIKE locks the target until its
-- transaction ends, and the copy's transaction then takes the shape from here without locking the target (a commit
-- that attaches a big batch detaches the open partition: it would wait for the copy). Temporary, so a rollup
-- whose process dies leaves nothing behind.
DROP TABLE IF EXISTS pg_temp.{template};
CREATE TEMP TABLE {template} (LIKE {schema}.{table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING GENERATED
                              INCLUDING INDEXES INCLUDING STORAGE);

-- name: drop_rollup_template
DROP TABLE IF EXISTS pg_temp.{template};

-- name: table_oid
SELECT to_regclass(quote_ident(:schema) || '.' || quote_ident(:table))::oid;

-- name: hold_partitions
-- Writers of the merged partitions (a replay's removal, a user's UPDATE) wait for the rollup from the copy to the
-- swap, so that no row changes in between; readers do not. NOWAIT: a rollup never waits for a writer that holds
-- one (it gives way), so it never waits while holding a lock that writer wants.
LOCK TABLE {partitions} IN SHARE MODE NOWAIT;

-- name: fresh_activity
-- pg_stat_activity is read once per transaction and kept; the rollup looks at it again within its own.
SELECT pg_stat_clear_snapshot();

-- name: open_snapshots
-- Other backends of this database holding a snapshot now (a statement running, a REPEATABLE READ transaction, an
-- exported snapshot, a logical replication slot's initial copy), by the xmin of their oldest one. Autovacuum's
-- are left out (it reads no rows for anyone). Other roles' backends show a snapshot only to a role with
-- pg_read_all_stats (or a superuser).
SELECT pid, backend_xmin::text AS xmin FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_xmin IS NOT NULL
  AND backend_type <> 'autovacuum worker' AND leader_pid IS DISTINCT FROM pg_backend_pid();

-- name: waiting_on_rollup
-- Backends waiting for a lock this one holds (a writer of a merged partition, a reader of the target after the
-- swap), from pg_locks, which shows other roles' waits too; the commit lock's waiters are not counted: they wait
-- for the swap's end and read after it.
SELECT count(*) FROM pg_locks
WHERE NOT granted AND locktype <> 'advisory' AND pg_backend_pid() = ANY(pg_blocking_pids(pid));

-- name: rollup_backend
-- The rollup's backend and its transaction, for its watchdog (rollup_watchdog.py).
SELECT pg_backend_pid() AS pid, pg_current_xact_id()::xid::text AS xid;

-- name: cancel_rollup_if_waited_on
-- The watchdog's look (its own connection, the rollup's role): when any backend waits for a lock the rollup
-- holds (pg_locks: readable by any role, unlike other roles' wait events in pg_stat_activity), cancel the
-- rollup's statement, if the backend is still in the rollup's transaction. Advisory waits are the commit lock's,
-- which wait for the swap's end (as waiting_on_rollup).
SELECT pg_cancel_backend(a.pid) FROM pg_stat_activity a
WHERE a.pid = :pid AND a.backend_xid = CAST(:xid AS xid)
  AND EXISTS (SELECT FROM pg_locks w WHERE NOT w.granted AND w.locktype <> 'advisory'
                                       AND CAST(:pid AS int) = ANY(pg_blocking_pids(w.pid)));
