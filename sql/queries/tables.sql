-- Staging and target tables. {placeholders} take quoted identifiers; {defs} and {set_list} are
-- rendered from validated column names and ledgerbatch's fixed type map (plugins/ledgerbatch/tables.py).

-- name: create_staging
-- Good rows, in the target's shape: an append commit attaches this very table as the batch's
-- partition of the target, so it is logged, carries its batch id and is indexed like the target.
CREATE TABLE ledger_staging.{staging} (
    {defs},
    _topic     text    NOT NULL,
    _partition integer NOT NULL,
    _offset    bigint  NOT NULL,
    _batch_id  bigint  NOT NULL CONSTRAINT staged_batch_only CHECK (_batch_id = :batch_id),
    UNIQUE (_topic, _partition, _offset, _batch_id)
);
CREATE TABLE ledger_staging.{bad} (
    _topic     text    NOT NULL,
    _partition integer NOT NULL,
    _offset    bigint  NOT NULL,
    _error     text    NOT NULL,
    _key       bytea,
    _value     bytea,
    PRIMARY KEY (_topic, _partition, _offset)
);

-- name: staging_delete_partition
-- Executors (psycopg2): drop what an earlier try of the same task left behind.
DELETE FROM ledger_staging.{staging} WHERE _topic = %(topic)s AND _partition = %(partition)s;
DELETE FROM ledger_staging.{bad} WHERE _topic = %(topic)s AND _partition = %(partition)s;

-- name: staging_copy
-- Executors (psycopg2): good rows as CSV, columns in the listed order.
COPY ledger_staging.{staging} ({columns}, _topic, _partition, _offset, _batch_id) FROM STDIN WITH (FORMAT csv);

-- name: staging_copy_bad
COPY ledger_staging.{bad} (_topic, _partition, _offset, _error, _key, _value) FROM STDIN WITH (FORMAT csv);

-- name: staging_task_lock
-- Executors (psycopg2): one writer per staging table and partition at a time.
SELECT pg_advisory_xact_lock(hashtext(%(lock)s));

-- name: staging_complete
SELECT to_regclass('ledger_staging.' || quote_ident(:bad)) IS NOT NULL
   AND EXISTS (SELECT 1 FROM information_schema.columns
               WHERE table_schema = 'ledger_staging' AND table_name = :staging AND column_name = '_batch_id');

-- name: lock_staging
-- The commit shuts out any straggling writer of the attempt before it counts and moves the rows.
LOCK TABLE ledger_staging.{staging}, ledger_staging.{bad} IN ACCESS EXCLUSIVE MODE;

-- name: staged_counts
SELECT _topic AS topic, _partition AS partition, sum(rows)::bigint AS rows, sum(bad)::bigint AS bad
FROM (SELECT _topic, _partition, count(*) AS rows, 0 AS bad FROM ledger_staging.{staging} GROUP BY 1, 2
      UNION ALL
      SELECT _topic, _partition, count(*), count(*) FROM ledger_staging.{bad} GROUP BY 1, 2) s
GROUP BY 1, 2;

-- name: staged_overlap
-- A coordinate staged both as a good row and as a bad record (each table is unique on its own).
SELECT count(*) FROM ledger_staging.{bad} b
JOIN ledger_staging.{staging} g ON g._topic = b._topic AND g._partition = b._partition AND g._offset = b._offset;

-- name: drop_staging
DROP TABLE IF EXISTS ledger_staging.{staging}, ledger_staging.{bad};

-- name: create_target_append
-- Partitions cover runs of batch ids (plugins/ledgerbatch/partitions.py): a big batch's staging table
-- is attached as a partition instead of being copied. Unique on the coordinates within a partition;
-- across partitions the ledger keeps them unique and `verify` checks it.
CREATE TABLE IF NOT EXISTS {schema}.{table} (
    {defs},
    _topic     text    NOT NULL,
    _partition integer NOT NULL,
    _offset    bigint  NOT NULL,
    _batch_id  bigint  NOT NULL,
    UNIQUE (_topic, _partition, _offset, _batch_id)
) PARTITION BY RANGE (_batch_id);

-- name: create_target_upsert
CREATE TABLE IF NOT EXISTS {schema}.{table} (
    {defs},
    _topic     text    NOT NULL,
    _partition integer NOT NULL,
    _offset    bigint  NOT NULL,
    _batch_id  bigint  NOT NULL,
    PRIMARY KEY ({key})
);

-- name: target_layout
-- Whether the target is partitioned, and whether this login may attach to it (owner, CREATE in schema).
SELECT c.relkind = 'p' AS partitioned,
       pg_has_role(c.relowner, 'USAGE') AND has_schema_privilege(n.oid, 'CREATE') AS can_attach
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = :schema AND c.relname = :table;

-- name: target_partitions
-- Each partition's batch id bounds; upper NULL is MAXVALUE.
SELECT p.relname AS name, m[1]::bigint AS lower, m[2]::bigint AS upper
FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhrelid
CROSS JOIN LATERAL regexp_match(pg_get_expr(p.relpartbound, p.oid),
                                'FROM \(''?(\d+)''?\) TO \((?:''?(\d+)''?|MAXVALUE)\)') m
WHERE i.inhparent = (SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                     WHERE n.nspname = :schema AND c.relname = :table);

-- name: close_partition
-- The open partition ends where a big batch begins: one scan validates the CHECK, which spares the
-- ATTACH another. (DETACH locks the target against readers until the commit ends.)
ALTER TABLE {schema}.{table} DETACH PARTITION {schema}.{partition};
ALTER TABLE {schema}.{partition} ADD CONSTRAINT batch_range CHECK (_batch_id >= :lower AND _batch_id < :upper);
ALTER TABLE {schema}.{table} ATTACH PARTITION {schema}.{partition} FOR VALUES FROM (:lower) TO (:upper);

-- name: attach_partition
-- Metadata only: the CHECK on _batch_id and the unique index built while staging spare PostgreSQL
-- a validation scan and an index build. The table leaves ledger_staging, so no writer finds it again;
-- without its CHECK it can take later small batches.
ALTER TABLE ledger_staging.{staging} RENAME TO {partition};
ALTER TABLE ledger_staging.{partition} SET SCHEMA {schema};
ALTER TABLE {schema}.{table} ATTACH PARTITION {schema}.{partition} FOR VALUES FROM (:batch_id) TO ({upper});
ALTER TABLE {schema}.{partition} DROP CONSTRAINT staged_batch_only;

-- name: insert_append
-- Small batches, and append targets created before targets were partitioned, take a copy of the rows.
INSERT INTO {schema}.{table} ({columns}, _topic, _partition, _offset, _batch_id)
SELECT {columns}, _topic, _partition, _offset, _batch_id
FROM ledger_staging.{staging};

-- name: insert_upsert
-- Within a batch the highest offset of a key wins; across batches the later batch wins.
INSERT INTO {schema}.{table} ({columns}, _topic, _partition, _offset, _batch_id)
SELECT DISTINCT ON ({key}) {columns}, _topic, _partition, _offset, _batch_id
FROM ledger_staging.{staging}
ORDER BY {key}, _offset DESC, _partition DESC
ON CONFLICT ({key}) DO UPDATE SET {set_list};

-- name: insert_quarantine
INSERT INTO ledger.quarantine (batch_id, pipeline, topic, partition, "offset", key, value, error)
SELECT :batch_id, :pipeline, _topic, _partition, _offset, _key, _value, _error
FROM ledger_staging.{bad};

-- name: set_lock_timeout
SELECT set_config('lock_timeout', :ms, true);

-- name: finished_staging_tables
-- Staging tables whose batch is finished (left by a crash between COMMIT and the clean-up), by
-- the name of the good-rows table (drop_staging drops the bad-records table with it).
SELECT DISTINCT regexp_replace(t.table_name, '_bad$', '') AS table_name FROM information_schema.tables t
JOIN ledger.batches b ON b.batch_id = substring(t.table_name FROM '^b(\d+)_a\d+(_bad)?$')::bigint
WHERE t.table_schema = 'ledger_staging' AND b.pipeline = :pipeline AND b.status IN ('committed', 'abandoned');
