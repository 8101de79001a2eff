-- Target mode `append` (plugins/ledgerbatch/commit/modes/append.py).

-- name: create_target_append
-- Partitions cover runs of batch ids (plugins/ledgerbatch/commit/modes/partitions.py): a big batch's staging table
-- is attached as a partition instead of being copied. Unique on the coordinates within a partition;
-- across partitions the ledger keeps them unique and `verify` checks it.
CREATE TABLE IF NOT EXISTS {schema}.{table} (
    {defs},  -- the spec's columns, then the lineage columns NOT NULL (tables.target_defs)
    UNIQUE (_topic, _partition, _offset, _batch_id)
) PARTITION BY RANGE (_batch_id);

-- name: target_partitions
-- Each partition's batch id bounds (upper NULL is MAXVALUE) and its size in bytes.
SELECT p.relname AS name, m[1]::bigint AS lower, m[2]::bigint AS upper, pg_total_relation_size(p.oid) AS size
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
-- without its CHECK it can take later small batches. The executors' grants stay behind (staging.sql: grant_staging).
REVOKE ALL ON ledger_staging.{staging} FROM ledgerbatch_stager;
ALTER TABLE ledger_staging.{staging} RENAME TO {partition};
ALTER TABLE ledger_staging.{partition} SET SCHEMA {schema};
ALTER TABLE {schema}.{table} ATTACH PARTITION {schema}.{partition} FOR VALUES FROM (:batch_id) TO ({upper});
ALTER TABLE {schema}.{partition} DROP CONSTRAINT staged_batch_only;

-- name: staging_pruned
-- Whether the ATTACH would build an index over rows commit/rejects.py removed from this staging table in this
-- transaction (ledgerbatch.pruned_staging): their versions stay in the table until the commit and an index
-- build takes them too, so a key too long for the index would fail the ATTACH again, on every round. True
-- where the target has an index the staging table lacks (any but the coordinates' unique one, which staging
-- built before the rows were removed): the rest of the batch is then copied.
SELECT coalesce(current_setting('ledgerbatch.pruned_staging', true), '') = :staging
   AND EXISTS (
       SELECT 1 FROM pg_index p
       WHERE p.indrelid = to_regclass(quote_ident(:schema) || '.' || quote_ident(:table))
         AND NOT EXISTS (
             SELECT 1 FROM pg_index s
             WHERE s.indrelid = to_regclass('ledger_staging.' || quote_ident(:staging))
               AND s.indisunique = p.indisunique
               AND s.indexprs IS NULL AND p.indexprs IS NULL AND s.indpred IS NULL AND p.indpred IS NULL
               AND ARRAY(SELECT a.attname FROM unnest(CAST(s.indkey AS int2[])) WITH ORDINALITY k(attnum, i)
                         JOIN pg_attribute a ON a.attrelid = s.indrelid AND a.attnum = k.attnum ORDER BY k.i)
                 = ARRAY(SELECT a.attname FROM unnest(CAST(p.indkey AS int2[])) WITH ORDINALITY k(attnum, i)
                         JOIN pg_attribute a ON a.attrelid = p.indrelid AND a.attnum = k.attnum ORDER BY k.i)))
   AS copy;

-- name: create_partition
-- An empty partition where a big batch's staging table would be attached: commit/rejects.py copies runs of
-- the batch's rows into it while it looks for the rows the target refuses.
CREATE TABLE {schema}.{partition} PARTITION OF {schema}.{table} FOR VALUES FROM (:batch_id) TO ({upper});

-- name: insert_append
-- Small batches, and append targets created before targets were partitioned, take a copy of the rows.
INSERT INTO {schema}.{table} ({columns}, _topic, _partition, _offset, _batch_id)
SELECT {columns}, _topic, _partition, _offset, _batch_id
FROM ledger_staging.{staging};

-- name: delete_target_in_ranges
-- A replay first removes what earlier deliveries of its ranges (given as arrays) left in the target, never
-- its own rows (those the probes of commit/rejects.py kept before it).
DELETE FROM {schema}.{table} t USING unnest(CAST(:topics AS text[]), CAST(:partitions AS integer[]), CAST(:from_offsets AS bigint[]),
            CAST(:until_offsets AS bigint[])) AS r(topic, partition, from_offset, until_offset)
WHERE t._topic = r.topic AND t._partition = r.partition
  AND t._offset >= r.from_offset AND t._offset < r.until_offset AND t._batch_id <> :batch_id;

-- name: create_merged_partition
-- Rollup (plugins/ledgerbatch/commit/modes/rollup.py): a table in the target's shape (its defaults, CHECKs,
-- generation expressions and indexes, by way of rollup.sql's create_rollup_template) outside the partition tree,
-- so filling it fires no user trigger; the CHECK spares the ATTACH its validation scan.
CREATE TABLE {schema}.{merged} (LIKE pg_temp.{template} INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING GENERATED
                                INCLUDING INDEXES INCLUDING STORAGE);
ALTER TABLE {schema}.{merged} ADD CONSTRAINT batch_range CHECK (_batch_id >= :lower AND _batch_id < :upper);

-- name: copy_partition
INSERT INTO {schema}.{merged} ({columns}) SELECT {columns} FROM {schema}.{partition};

-- name: drop_partition
ALTER TABLE {schema}.{table} DETACH PARTITION {schema}.{partition};
DROP TABLE {schema}.{partition};

-- name: attach_merged_partition
-- Metadata only: the CHECK and the indexes built with the table let PostgreSQL skip the scan and the build.
ALTER TABLE {schema}.{merged} RENAME TO {partition};
ALTER TABLE {schema}.{table} ATTACH PARTITION {schema}.{partition} FOR VALUES FROM (:lower) TO (:upper);
