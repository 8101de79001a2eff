-- What Spark tasks run against staging tables, through psycopg2: parameters are %(name)s here, as
-- nowhere else; {placeholders} take quoted identifiers only. The driver renders these (executors
-- may not have sql/) and ships the text in the staging job.

-- name: staging_session
-- Executors (psycopg2), once a connection: a staging commit need not wait for its WAL to reach the disk.
-- The batch's commit waits for its own, which comes later in the WAL, so its flush makes every staging
-- commit before it durable too; a server crash before that can only lose an attempt that then fails.
SET synchronous_commit = off;

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

-- name: staging_copy_binary
-- Executors (psycopg2): good rows in PostgreSQL's binary format (stage/binary_copy.py), no text to parse.
COPY ledger_staging.{staging} ({columns}, _topic, _partition, _offset, _batch_id) FROM STDIN WITH (FORMAT binary);

-- name: staging_copy_bad
COPY ledger_staging.{bad} (_topic, _partition, _offset, _error, _key, _value) FROM STDIN WITH (FORMAT csv);

-- name: record_staged_read
-- Executors (psycopg2), query pipelines: what this task read from its range, in the transaction
-- that stages the range's bad records; a retried task replaces its row (ledger.staged_reads).
INSERT INTO ledger.staged_reads (batch_id, attempt, topic, partition, records, bad)
VALUES (%(batch_id)s, %(attempt)s, %(topic)s, %(partition)s, %(records)s, %(bad)s)
ON CONFLICT (batch_id, attempt, topic, partition) DO UPDATE SET records = EXCLUDED.records, bad = EXCLUDED.bad;

-- name: staging_delete_bad
-- Executors (psycopg2), query pipelines: drop the bad records an earlier try of the task left behind.
DELETE FROM ledger_staging.{bad} WHERE _topic = %(topic)s AND _partition = %(partition)s;

-- name: staging_copy_groups
-- Executors (psycopg2), aggregate pipelines: the query's output groups as CSV.
COPY ledger_staging.{staging} ({columns}, _batch_id) FROM STDIN WITH (FORMAT csv);

-- name: staging_copy_groups_binary
-- Executors (psycopg2), aggregate pipelines: the query's output groups in the binary format.
COPY ledger_staging.{staging} ({columns}, _batch_id) FROM STDIN WITH (FORMAT binary);
