-- `ledgerbatch verify --deep` (plugins/ledgerbatch/ops/deep_verify.py): the committed ranges read again from
-- Kafka into a staging table (never committed) and compared with what the target and the quarantine hold.
-- Each comparison gives (problem, records, examples): how many coordinates, and up to 10 of them.

-- name: delivered_ranges
-- The ranges committed live or backfill batches delivered: all, since a batch, or a sample of the batches
-- (by a hash of their id, so the same fraction picks the same batches).
SELECT r.topic, r.partition, r.from_offset, r.until_offset
FROM ledger.batch_ranges r JOIN ledger.batches b USING (batch_id)
WHERE b.pipeline = :pipeline AND b.kind IN ('live', 'backfill') AND b.status = 'committed' AND b.batch_id >= :since
  AND (abs(hashtext(b.batch_id::text)) % 1000000) < :sample * 1000000
ORDER BY r.topic, r.partition, r.from_offset;

-- name: deep_append
-- Append: every good record is a row with its coordinates and its values (unless the target refused it:
-- then it is in quarantine), and every row of the ranges is such a record.
WITH r AS (
    SELECT * FROM unnest(CAST(:topics AS text[]), CAST(:partitions AS integer[]), CAST(:from_offsets AS bigint[]),
                         CAST(:until_offsets AS bigint[])) AS r(topic, partition, from_offset, until_offset)
), t AS (
    SELECT t.* FROM {schema}.{table} t JOIN r ON t._topic = r.topic AND t._partition = r.partition
                                            AND t._offset >= r.from_offset AND t._offset < r.until_offset
), found AS (  -- one pass: a full join of the rows and the records by coordinates
    SELECT CASE WHEN t._offset IS NULL THEN 'good records missing from the target'
                WHEN s._offset IS NULL THEN 'rows that are not a good record in Kafka'
                WHEN ROW({columns_t}) IS DISTINCT FROM ROW({columns_s}) THEN 'rows that differ from their record in Kafka'
           END AS problem,
           coalesce(t._topic, s._topic) AS topic, coalesce(t._partition, s._partition) AS partition,
           coalesce(t._offset, s._offset) AS "offset"
    FROM t FULL JOIN ledger_staging.{staging} s
      ON s._topic = t._topic AND s._partition = t._partition AND s._offset = t._offset
)
SELECT problem, count(*) AS records,
       (array_agg(topic || '[' || partition || '] offset ' || "offset" ORDER BY topic, partition, "offset"))[1:10] AS examples
FROM found f
WHERE problem IS NOT NULL
  AND NOT (problem = 'good records missing from the target'  -- a row the target refused is in quarantine
           AND EXISTS (SELECT 1 FROM ledger.quarantine q WHERE q.pipeline = :pipeline AND q.sqlstate IS NOT NULL
                       AND q.topic = f.topic AND q.partition = f.partition AND q."offset" = f."offset"))
GROUP BY problem ORDER BY problem;

-- name: deep_upsert
-- Upsert, per key: a row whose coordinates lie in the ranges holds the values of the record at those
-- coordinates; no key's row is older ({older}) than a change of its key the ranges deliver (the row must
-- be its key's last change, or newer: a row from outside the ranges is checked when its own range is); a
-- key whose change the ranges deliver as an upsert has a row, unless a delete no older than that change
-- removed it. Changes the target refused (quarantined) were never delivered and are left out.
WITH r AS (
    SELECT * FROM unnest(CAST(:topics AS text[]), CAST(:partitions AS integer[]), CAST(:from_offsets AS bigint[]),
                         CAST(:until_offsets AS bigint[])) AS r(topic, partition, from_offset, until_offset)
), t AS (
    SELECT t.* FROM {schema}.{table} t JOIN r ON t._topic = r.topic AND t._partition = r.partition
                                            AND t._offset >= r.from_offset AND t._offset < r.until_offset
), s AS (  -- the changes the ranges deliver
    SELECT * FROM ledger_staging.{staging} s WHERE {changes}
      AND NOT EXISTS (SELECT 1 FROM ledger.quarantine q WHERE q.pipeline = :pipeline AND q.sqlstate IS NOT NULL
                      AND q.topic = s._topic AND q.partition = s._partition AND q."offset" = s._offset)
), found AS (
    SELECT 'rows that differ from their record in Kafka' AS problem, NULL AS key, t._topic AS topic,
           t._partition AS partition, t._offset AS "offset"
    FROM t JOIN s ON s._topic = t._topic AND s._partition = t._partition AND s._offset = t._offset
    WHERE {upserts} AND ROW({columns_t}) IS DISTINCT FROM ROW({columns_s})
    UNION ALL
    SELECT 'rows that are not a good record in Kafka', NULL, t._topic, t._partition, t._offset
    FROM t WHERE NOT EXISTS (SELECT 1 FROM s WHERE {upserts} AND s._topic = t._topic AND s._partition = t._partition
                                                 AND s._offset = t._offset)
    UNION ALL
    SELECT DISTINCT ON ({key_c}) 'keys whose row is not their last change: the row is older',
           CAST(ROW({key_c}) AS text), t._topic, t._partition, t._offset
    FROM s c JOIN {schema}.{table} t ON {match_t}
    WHERE {older}
    UNION ALL
    SELECT DISTINCT ON ({key_c}) 'keys whose last change is an upsert but have no row',
           CAST(ROW({key_c}) AS text), c._topic, c._partition, c._offset
    FROM s c
    WHERE {upserts_c} AND NOT EXISTS (SELECT 1 FROM {schema}.{table} t WHERE {match_t}) AND NOT {deleted}
)
SELECT problem, count(*) AS records,
       (array_agg(coalesce('key ' || key || ' at ', '') || topic || '[' || partition || '] offset ' || "offset"
                  ORDER BY topic, partition, "offset"))[1:10] AS examples
FROM found GROUP BY problem ORDER BY problem;

-- name: deep_quarantine
-- Every bad record is in ledger.quarantine with the same raw bytes; every bad record quarantined from the
-- ranges is still bad (rows the target refused are checked with the rows).
WITH r AS (
    SELECT * FROM unnest(CAST(:topics AS text[]), CAST(:partitions AS integer[]), CAST(:from_offsets AS bigint[]),
                         CAST(:until_offsets AS bigint[])) AS r(topic, partition, from_offset, until_offset)
), q AS (
    SELECT q.* FROM ledger.quarantine q JOIN r ON q.topic = r.topic AND q.partition = r.partition
                                              AND q."offset" >= r.from_offset AND q."offset" < r.until_offset
    WHERE q.pipeline = :pipeline AND q.sqlstate IS NULL
), found AS (
    SELECT 'bad records missing from quarantine' AS problem, b._topic AS topic, b._partition AS partition,
           b._offset AS "offset"
    FROM ledger_staging.{bad} b
    WHERE NOT EXISTS (SELECT 1 FROM q WHERE q.topic = b._topic AND q.partition = b._partition AND q."offset" = b._offset)
    UNION ALL
    SELECT 'quarantined records whose bytes differ from Kafka''s', q.topic, q.partition, q."offset"
    FROM q JOIN ledger_staging.{bad} b ON q.topic = b._topic AND q.partition = b._partition AND q."offset" = b._offset
    WHERE q.value IS DISTINCT FROM b._value OR q.key IS DISTINCT FROM b._key
    UNION ALL
    SELECT 'quarantined records that are not bad in Kafka', q.topic, q.partition, q."offset"
    FROM q WHERE NOT EXISTS (SELECT 1 FROM ledger_staging.{bad} b
                             WHERE b._topic = q.topic AND b._partition = q.partition AND b._offset = q."offset")
)
SELECT problem, count(*) AS records,
       (array_agg(topic || '[' || partition || '] offset ' || "offset" ORDER BY topic, partition, "offset"))[1:10] AS examples
FROM found GROUP BY problem ORDER BY problem;

-- name: standing_batches
-- Aggregate: the committed batches whose contributions stand (no later committed batch delivered any of
-- their offsets again), all, since a batch, or a sample (as delivered_ranges), with their ranges.
WITH superseded AS (
    SELECT DISTINCT r.batch_id
    FROM ledger.batch_ranges r JOIN ledger.batch_ranges o
      ON o.pipeline = r.pipeline AND o.topic = r.topic AND o.partition = r.partition AND o.committed
     AND o.batch_id > r.batch_id AND o.from_offset < r.until_offset AND r.from_offset < o.until_offset
    WHERE r.pipeline = :pipeline AND r.committed
)
SELECT r.batch_id, r.topic, r.partition, r.from_offset, r.until_offset
FROM ledger.batch_ranges r JOIN ledger.batches b USING (batch_id)
WHERE b.pipeline = :pipeline AND b.status = 'committed' AND b.batch_id >= :since
  AND (abs(hashtext(b.batch_id::text)) % 1000000) < :sample * 1000000
  AND r.until_offset > r.from_offset AND r.batch_id NOT IN (SELECT batch_id FROM superseded)
ORDER BY r.topic, r.partition, r.from_offset;

-- name: deep_aggregate
-- Aggregate: the groups the standing batches' records make, read again from Kafka (the staging table),
-- against those batches' contributions, both merged by key ({measures_agg}).
WITH kafka AS (
    SELECT {key}, {measures_agg}, true AS _present FROM ledger_staging.{staging} c GROUP BY {key}
), contributed AS (
    SELECT {key}, {measures_agg}, true AS _present FROM ledger_aggregates.{contributions} c
    WHERE c._batch_id = ANY(CAST(:batches AS bigint[])) GROUP BY {key}
), found AS (
    SELECT CASE WHEN c._present IS NULL THEN 'groups of Kafka''s records missing from the contributions'
                WHEN r._present IS NULL THEN 'contributed groups that no record in Kafka makes'
                WHEN {differs} THEN 'contributed groups that differ from Kafka''s records'
           END AS problem,
           CAST(ROW({key}) AS text) AS example
    FROM contributed c FULL JOIN kafka r USING ({key})
)
SELECT problem, count(*) AS records, (array_agg('group ' || example ORDER BY example))[1:10] AS examples
FROM found WHERE problem IS NOT NULL GROUP BY problem ORDER BY problem;
