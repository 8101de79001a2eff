-- Queries of ops/run.py's outage decisions (ops/outages.py) and of the commit's lock_timeout.

-- name: target_lock_holders
-- The other sessions in a transaction that block a writer of the target, oldest transaction first: those
-- holding (or queued ahead for) a lock on the target or one of its partitions in a mode that conflicts with
-- a writer's ROW EXCLUSIVE or an ATTACH's SHARE UPDATE EXCLUSIVE (a reader's ACCESS SHARE, a row locker's
-- ROW SHARE, another writer's ROW EXCLUSIVE do not), and, where an error's context named the table of a row
-- lock waited for (:row_table, NULL if none), those holding any lock but ACCESS SHARE on it (a row lock
-- takes ROW SHARE or ROW EXCLUSIVE on its table): the candidates, pg_locks does not list row locks.
SELECT a.pid, a.usename, l.mode, a.state, a.xact_start, left(regexp_replace(a.query, '\s+', ' ', 'g'), 120) AS query
FROM pg_locks l
JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'relation'
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) AND l.pid <> pg_backend_pid() AND a.xact_start IS NOT NULL
  AND ((l.mode NOT IN ('AccessShareLock', 'RowShareLock', 'RowExclusiveLock')
        AND (l.relation = to_regclass(:target)
             OR l.relation IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = to_regclass(:target))))
       OR (l.granted AND l.mode <> 'AccessShareLock' AND l.relation = to_regclass(quote_ident(:row_table))))
ORDER BY a.xact_start, a.pid;

-- name: lock_timeout_below_statement_timeout
-- A lock wait in this transaction ends as 55P03 (lock_not_available: an outage) before the session's
-- statement_timeout cuts it as 57014, which then means the statement itself was too slow. Only where a
-- statement_timeout is set and no shorter lock_timeout is: 9/10 of it. It runs in every commit: the settings
-- are read with current_setting (as '90s', '1500ms', '0': an interval in milliseconds), not from pg_settings,
-- which builds every setting of the server twice (2 ms a commit under load).
SELECT set_config('lock_timeout', (t.statement_ms * 9 / 10)::text, true)
FROM (SELECT (extract(epoch FROM current_setting('statement_timeout')::interval) * 1000)::bigint AS statement_ms,
             (extract(epoch FROM current_setting('lock_timeout')::interval) * 1000)::bigint AS lock_ms) t
WHERE t.statement_ms > 0 AND (t.lock_ms = 0 OR t.lock_ms > t.statement_ms * 9 / 10);
