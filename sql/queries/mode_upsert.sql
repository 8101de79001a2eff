-- Target mode `upsert` (plugins/ledgerbatch/commit/modes/upsert.py).

-- name: create_target_upsert
CREATE TABLE IF NOT EXISTS {schema}.{table} (
    {defs},  -- the spec's columns, then the lineage columns NOT NULL (tables.target_defs)
    PRIMARY KEY ({key})
);

-- name: insert_upsert
-- Within a batch the highest offset of a key wins; across batches the later batch wins.
INSERT INTO {schema}.{table} ({columns}, _topic, _partition, _offset, _batch_id)
SELECT DISTINCT ON ({key}) {columns}, _topic, _partition, _offset, _batch_id
FROM ledger_staging.{staging}
ORDER BY {key}, _offset DESC, _partition DESC
ON CONFLICT ({key}) DO UPDATE SET {set_list};

-- name: replay_upsert
-- A replayed record replaces a row only where that row's value came from the replayed ranges
-- (or the key is absent): newer values from later offsets are kept.
INSERT INTO {schema}.{table} AS t ({columns}, _topic, _partition, _offset, _batch_id)
SELECT DISTINCT ON ({key}) {columns}, _topic, _partition, _offset, _batch_id
FROM ledger_staging.{staging}
ORDER BY {key}, _offset DESC, _partition DESC
ON CONFLICT ({key}) DO UPDATE SET {set_list}
WHERE EXISTS (SELECT 1 FROM unnest(CAST(:topics AS text[]), CAST(:partitions AS integer[]), CAST(:from_offsets AS bigint[]),
                   CAST(:until_offsets AS bigint[])) AS r(topic, partition, from_offset, until_offset)
              WHERE r.topic = t._topic AND r.partition = t._partition
                AND t._offset >= r.from_offset AND t._offset < r.until_offset);

-- name: replay_drop_stale
-- Before a replay upserts: a row whose value came from the replayed ranges, of a key the replay gives no
-- row any more (its record is now bad, or a query drops it), is removed, so that no coordinate is both a
-- row and quarantined (or filtered). An older value of the key, from before the ranges, is not brought back.
DELETE FROM {schema}.{table} t
USING unnest(CAST(:topics AS text[]), CAST(:partitions AS integer[]), CAST(:from_offsets AS bigint[]),
                   CAST(:until_offsets AS bigint[])) AS r(topic, partition, from_offset, until_offset)
WHERE t._topic = r.topic AND t._partition = r.partition AND t._offset >= r.from_offset AND t._offset < r.until_offset
  AND NOT EXISTS (SELECT 1 FROM ledger_staging.{staging} c WHERE {match_t});

-- name: upsert_replay_diff
-- Dry run of an upsert replay, by key as replay_upsert and replay_drop_stale decide: a key's last staged
-- row is added (no row), changed or unchanged (a row from the replayed ranges, or a newer row the replay
-- keeps); rows of the ranges whose key the replay no longer gives are removed.
WITH c AS (
    SELECT DISTINCT ON ({key}) * FROM ledger_staging.{staging} ORDER BY {key}, _offset DESC, _partition DESC
), judged AS (
    SELECT t._offset IS NULL AS added,
           t._offset IS NOT NULL AND ROW({columns_c}) IS DISTINCT FROM ROW({columns_t})
             AND EXISTS (SELECT 1 FROM unnest(CAST(:topics AS text[]), CAST(:partitions AS integer[]), CAST(:from_offsets AS bigint[]),
                   CAST(:until_offsets AS bigint[])) AS r(topic, partition, from_offset, until_offset)
                         WHERE r.topic = t._topic AND r.partition = t._partition
                           AND t._offset >= r.from_offset AND t._offset < r.until_offset) AS changed
    FROM c LEFT JOIN {schema}.{table} t ON {match_t}
)
SELECT count(*) FILTER (WHERE added) AS added,
       (SELECT count(*) FROM {schema}.{table} t JOIN unnest(CAST(:topics AS text[]), CAST(:partitions AS integer[]), CAST(:from_offsets AS bigint[]),
                   CAST(:until_offsets AS bigint[])) AS r(topic, partition, from_offset, until_offset)
          ON t._topic = r.topic AND t._partition = r.partition AND t._offset >= r.from_offset AND t._offset < r.until_offset
        WHERE NOT EXISTS (SELECT 1 FROM ledger_staging.{staging} c WHERE {match_t})) AS removed,
       count(*) FILTER (WHERE changed) AS changed,
       count(*) FILTER (WHERE NOT added AND NOT changed) AS unchanged
FROM judged;

-- Change pipelines (format debezium, or target.deletes): every staged row is a change, `_change`
-- 'u' (upsert), 'd' (delete the key) or 's' (skipped). ledger_deletes.<pipeline> keeps the last delete of
-- every deleted key, so the target's rows and it together hold the last change delivered of every key.

-- name: create_deletes
CREATE TABLE IF NOT EXISTS ledger_deletes.{deletes} (
    {defs},  -- the target's columns (tables.target_defs): only the key and the lineage are filled
    PRIMARY KEY ({key})
);

-- name: last_changes
-- Each key's last change in the batch (highest offset), where it wins over the key's last change
-- delivered so far: a live batch always wins; a replay wins where that last change (the key's target
-- row or its delete) lies inside the replayed ranges, or before this change in the same partition, or
-- there is none. So a replay never brings back a row that a later change deleted, nor deletes a row a
-- later change wrote. A backfill (offsets below the start) wins only where its key has no change delivered
-- (or an older one of its own partition, another backfill's): "there is none" must be true, so compaction keeps
-- the deletes while a backfill can come (ledger_compact.sql: backfill_gaps) and, once it forgot some, backfills
-- are refused (ledger/cursors.py: range_kind).
CREATE TEMPORARY TABLE lb_last_changes ON COMMIT DROP AS
SELECT c.* FROM (
    SELECT DISTINCT ON ({key}) {columns}, _change, _topic, _partition, _offset, _batch_id
    FROM ledger_staging.{staging}
    WHERE _change <> 's'
    ORDER BY {key}, _offset DESC, _partition DESC) c
LEFT JOIN {schema}.{table} t ON {match_t}
LEFT JOIN ledger_deletes.{deletes} d ON {match_d}
WHERE CAST(:live AS boolean)
   OR coalesce(t._offset, d._offset) IS NULL
   OR (coalesce(t._topic, d._topic) = c._topic AND coalesce(t._partition, d._partition) = c._partition
       AND coalesce(t._offset, d._offset) < c._offset)
   OR EXISTS (SELECT 1 FROM unnest(CAST(:topics AS text[]), CAST(:partitions AS integer[]), CAST(:from_offsets AS bigint[]),
                  CAST(:until_offsets AS bigint[])) AS r(topic, partition, from_offset, until_offset)
              WHERE r.topic = coalesce(t._topic, d._topic) AND r.partition = coalesce(t._partition, d._partition)
                AND coalesce(t._offset, d._offset) >= r.from_offset AND coalesce(t._offset, d._offset) < r.until_offset);

-- name: replay_drop_stale_changes
-- A change replay's rows and deletes that came from its ranges, of keys it no longer changes (their
-- records are now bad): removed before its changes apply, as replay_drop_stale does for rows.
DELETE FROM {schema}.{table} t
USING unnest(CAST(:topics AS text[]), CAST(:partitions AS integer[]), CAST(:from_offsets AS bigint[]),
                   CAST(:until_offsets AS bigint[])) AS r(topic, partition, from_offset, until_offset)
WHERE t._topic = r.topic AND t._partition = r.partition AND t._offset >= r.from_offset AND t._offset < r.until_offset
  AND NOT EXISTS (SELECT 1 FROM ledger_staging.{staging} c WHERE c._change <> 's' AND {match_t});
DELETE FROM ledger_deletes.{deletes} d
USING unnest(CAST(:topics AS text[]), CAST(:partitions AS integer[]), CAST(:from_offsets AS bigint[]),
                   CAST(:until_offsets AS bigint[])) AS r(topic, partition, from_offset, until_offset)
WHERE d._topic = r.topic AND d._partition = r.partition AND d._offset >= r.from_offset AND d._offset < r.until_offset
  AND NOT EXISTS (SELECT 1 FROM ledger_staging.{staging} c WHERE c._change <> 's' AND {match_d});

-- name: apply_deletes
DELETE FROM {schema}.{table} t USING lb_last_changes c WHERE c._change = 'd' AND {match_t};

-- name: apply_upserts
INSERT INTO {schema}.{table} ({columns}, _topic, _partition, _offset, _batch_id)
SELECT {columns}, _topic, _partition, _offset, _batch_id FROM lb_last_changes WHERE _change = 'u'
ON CONFLICT ({key}) DO UPDATE SET {set_list};

-- name: forget_deletes
-- A key written again is no longer deleted.
DELETE FROM ledger_deletes.{deletes} d USING lb_last_changes c WHERE c._change = 'u' AND {match_d};

-- name: record_deletes
-- A deleted key with its coordinates, and its version where target.version orders the changes ({kept}).
INSERT INTO ledger_deletes.{deletes} ({kept}, _topic, _partition, _offset, _batch_id)
SELECT {kept}, _topic, _partition, _offset, _batch_id FROM lb_last_changes WHERE _change = 'd'
ON CONFLICT ({key}) DO UPDATE
SET ({kept}, _topic, _partition, _offset, _batch_id)
    = ROW({kept_excluded}, EXCLUDED._topic, EXCLUDED._partition, EXCLUDED._offset, EXCLUDED._batch_id);

-- name: drop_last_changes
DROP TABLE lb_last_changes;

-- name: changes_diff
-- Dry run of a change pipeline's replay, after last_changes: what its winning changes would do.
SELECT count(*) FILTER (WHERE c._change = 'u' AND t._offset IS NULL) AS added,
       count(*) FILTER (WHERE c._change = 'd' AND t._offset IS NOT NULL) AS removed,
       count(*) FILTER (WHERE c._change = 'u' AND t._offset IS NOT NULL AND ROW({columns_c}) IS DISTINCT FROM ROW({columns_t})) AS changed,
       count(*) FILTER (WHERE c._change = 'u' AND t._offset IS NOT NULL AND ROW({columns_c}) IS NOT DISTINCT FROM ROW({columns_t})) AS unchanged
FROM lb_last_changes c LEFT JOIN {schema}.{table} t ON {match_t};
