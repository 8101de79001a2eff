-- What Spark tasks run against staging tables, through psycopg2: parameters are %(name)s here, as
-- nowhere else; {placeholders} take quoted identifiers only. The driver renders these (executors
-- may not have sql/) and ships the text in the staging job.

-- name: staging_task_lock
-- Executors (psycopg2): one writer per staging table and partition at a time.
SELECT pg_advisory_xact_lock(hashtext(%(lock)s));

-- name: staging_delete_partition
-- Executors (psycopg2): drop what an earlier try of the same task left behind.
DELETE FROM ledger_staging.{staging} WHERE _topic = %(topic)s AND _partition = %(partition)s;
DELETE FROM ledger_staging.{bad} WHERE _topic = %(topic)s AND _partition = %(partition)s;

-- name: staging_copy
-- Executors (psycopg2): good rows as CSV, columns in the listed order.
COPY ledger_staging.{staging} ({columns}, _topic, _partition, _offset, _batch_id) FROM STDIN WITH (FORMAT csv);

-- name: staging_copy_bad
COPY ledger_staging.{bad} (_topic, _partition, _offset, _error, _key, _value) FROM STDIN WITH (FORMAT csv);
