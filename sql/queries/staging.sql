-- A batch's staging tables (plugins/ledgerbatch/stage/tables.py). {placeholders} take quoted identifiers;
-- {defs} is rendered from validated column names and ledgerbatch's fixed type map.

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

-- name: create_staging_bad
-- Bad records of the attempt, with the reason and the raw bytes.
CREATE TABLE ledger_staging.{bad} (
    _topic     text    NOT NULL,
    _partition integer NOT NULL,
    _offset    bigint  NOT NULL,
    _error     text    NOT NULL,
    _key       bytea,
    _value     bytea,
    PRIMARY KEY (_topic, _partition, _offset)
);

-- name: create_staging_groups
-- An aggregate batch's result: one row per group (its key columns are NOT NULL, as in the target).
CREATE TABLE ledger_staging.{staging} (
    {defs},
    _batch_id  bigint  NOT NULL CONSTRAINT staged_batch_only CHECK (_batch_id = :batch_id),
    PRIMARY KEY ({key})
);

-- name: grant_staging
-- Executors stage as ledgerbatch_stager (migration 017): they COPY into the attempt's tables and delete what an
-- earlier try of their task left (by coordinates; the rows' values stay unreadable to them).
GRANT INSERT, DELETE ON ledger_staging.{staging}, ledger_staging.{bad} TO ledgerbatch_stager;
GRANT SELECT (_topic, _partition) ON ledger_staging.{bad} TO ledgerbatch_stager;

-- name: grant_staging_coordinates
-- Good rows with coordinates (an aggregate's groups have none and are never deleted by a task).
GRANT SELECT (_topic, _partition) ON ledger_staging.{staging} TO ledgerbatch_stager;

-- name: staging_complete
-- Both tables exist and the good rows' table has every listed column (:columns, a text array). From
-- pg_attribute: information_schema.columns took 12 ms a commit with 100 pipelines' tables in the catalog.
SELECT to_regclass('ledger_staging.' || quote_ident(:bad)) IS NOT NULL
   AND (SELECT count(*) FROM pg_catalog.pg_attribute
        WHERE attrelid = to_regclass('ledger_staging.' || quote_ident(:staging)) AND attnum > 0
          AND NOT attisdropped AND attname = ANY(CAST(:columns AS text[])))
       = cardinality(CAST(:columns AS text[]));

-- name: lock_staging
-- The commit shuts out any straggling writer of the attempt before it counts and moves the rows.
LOCK TABLE ledger_staging.{staging}, ledger_staging.{bad} IN ACCESS EXCLUSIVE MODE;

-- name: cheap_parallel_scans
-- Until default_parallel_scans: a staging table just filled has no statistics yet, and without these
-- PostgreSQL counts its 1M rows in one process (0.17-0.23 s) where two workers take 0.09-0.12 s.
SET LOCAL parallel_setup_cost = 0;
SET LOCAL parallel_tuple_cost = 0;

-- name: default_parallel_scans
SET LOCAL parallel_setup_cost TO DEFAULT;
SET LOCAL parallel_tuple_cost TO DEFAULT;

-- name: staged_counts
SELECT _topic AS topic, _partition AS partition, sum(rows)::bigint AS rows, sum(bad)::bigint AS bad
FROM (SELECT _topic, _partition, count(*) AS rows, 0 AS bad FROM ledger_staging.{staging} GROUP BY 1, 2
      UNION ALL
      SELECT _topic, _partition, count(*), count(*) FROM ledger_staging.{bad} GROUP BY 1, 2) s
GROUP BY 1, 2;

-- name: staged_changes
-- Change pipelines: the staged records that delete a key, and those skipped by design (parse.CHANGE).
SELECT count(*) FILTER (WHERE _change = 'd') AS deleted, count(*) FILTER (WHERE _change = 's') AS skipped
FROM ledger_staging.{staging};

-- name: staged_overlap
-- A coordinate staged both as a good row and as a bad record (each table is unique on its own).
SELECT count(*) FROM ledger_staging.{bad} b
JOIN ledger_staging.{staging} g ON g._topic = b._topic AND g._partition = b._partition AND g._offset = b._offset;

-- name: drop_staging
DROP TABLE IF EXISTS ledger_staging.{staging}, ledger_staging.{bad};

-- name: set_lock_timeout
SELECT set_config('lock_timeout', :ms, true);

-- name: staged_rows
SELECT count(*) FROM ledger_staging.{staging};

-- name: staged_bad
-- Bad records per range.
SELECT _topic AS topic, _partition AS partition, count(*) AS bad FROM ledger_staging.{bad} GROUP BY 1, 2;
