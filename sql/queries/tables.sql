-- Staging and target tables. {placeholders} take quoted identifiers; {defs} and {set_list} are
-- rendered from validated column names and ledgerbatch's fixed type map (plugins/ledgerbatch/tables.py).

-- name: create_staging
CREATE UNLOGGED TABLE ledger_staging.{staging} (
    {defs},
    _topic     text    NOT NULL,
    _partition integer NOT NULL,
    _offset    bigint  NOT NULL,
    _error     text,
    _key       bytea,
    _value     bytea
);

-- name: staging_delete_partition
-- Executors (psycopg2): drop what an earlier try of the same task left behind.
DELETE FROM ledger_staging.{staging} WHERE _topic = %s AND _partition = %s;

-- name: staging_copy
-- Executors (psycopg2): each task streams its range as CSV, columns in the staged schema's order.
COPY ledger_staging.{staging} FROM STDIN WITH (FORMAT csv);

-- name: staging_task_lock
-- Executors (psycopg2): one writer per staging table and partition at a time.
SELECT pg_advisory_xact_lock(hashtext(%s));

-- name: staged_counts
SELECT _topic AS topic, _partition AS partition, count(*) AS rows, count(_error) AS bad,
       count(DISTINCT _offset) AS distinct_offsets
FROM ledger_staging.{staging} GROUP BY _topic, _partition;

-- name: drop_staging
DROP TABLE IF EXISTS ledger_staging.{staging};

-- name: create_target_append
CREATE TABLE IF NOT EXISTS {schema}.{table} (
    {defs},
    _topic     text    NOT NULL,
    _partition integer NOT NULL,
    _offset    bigint  NOT NULL,
    _batch_id  bigint  NOT NULL,
    UNIQUE (_topic, _partition, _offset)
);

-- name: create_target_upsert
CREATE TABLE IF NOT EXISTS {schema}.{table} (
    {defs},
    _topic     text    NOT NULL,
    _partition integer NOT NULL,
    _offset    bigint  NOT NULL,
    _batch_id  bigint  NOT NULL,
    PRIMARY KEY ({key})
);

-- name: insert_append
INSERT INTO {schema}.{table} ({columns}, _topic, _partition, _offset, _batch_id)
SELECT {columns}, _topic, _partition, _offset, :batch_id
FROM ledger_staging.{staging}
WHERE _error IS NULL;

-- name: insert_upsert
-- Within a batch the highest offset of a key wins; across batches the later batch wins.
INSERT INTO {schema}.{table} ({columns}, _topic, _partition, _offset, _batch_id)
SELECT DISTINCT ON ({key}) {columns}, _topic, _partition, _offset, :batch_id
FROM ledger_staging.{staging}
WHERE _error IS NULL
ORDER BY {key}, _offset DESC, _partition DESC
ON CONFLICT ({key}) DO UPDATE SET {set_list};

-- name: insert_quarantine
INSERT INTO ledger.quarantine (batch_id, pipeline, topic, partition, "offset", key, value, error)
SELECT :batch_id, :pipeline, _topic, _partition, _offset, _key, _value, _error
FROM ledger_staging.{staging}
WHERE _error IS NOT NULL;

-- name: set_lock_timeout
SELECT set_config('lock_timeout', :ms, true);

-- name: finished_staging_tables
-- Staging tables whose batch is finished (left by a crash between COMMIT and the clean-up).
SELECT t.table_name FROM information_schema.tables t
JOIN ledger.batches b ON t.table_name LIKE 'b' || b.batch_id || '\_a%'
WHERE t.table_schema = 'ledger_staging' AND b.pipeline = :pipeline AND b.status IN ('committed', 'abandoned');
