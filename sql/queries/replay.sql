-- Backfill and replay: re-reading ranges outside the live cursors.

-- name: delivered_overlap
-- How many offsets of [from, until) of one partition committed live or backfill batches delivered.
SELECT coalesce(sum(greatest(0, least(r.until_offset, :until_offset) - greatest(r.from_offset, :from_offset))), 0) AS overlap
FROM ledger.batch_ranges r
WHERE r.pipeline = :pipeline AND r.topic = :topic AND r.partition = :partition AND r.committed
  AND r.kind IN ('live', 'backfill');

-- name: cursor_of
SELECT start_offset, next_offset FROM ledger.cursors WHERE pipeline = :pipeline AND topic = :topic AND partition = :partition;

-- name: mark_abandoned
UPDATE ledger.batches SET status = 'abandoned', error = :reason, updated_at = now()
WHERE batch_id = :batch_id AND status IN ('planned', 'staged', 'failed');

-- name: delete_target_in_ranges
DELETE FROM {schema}.{table} t USING ledger.batch_ranges r
WHERE r.batch_id = :batch_id AND t._topic = r.topic AND t._partition = r.partition
  AND t._offset >= r.from_offset AND t._offset < r.until_offset;

-- name: delete_quarantine_in_ranges
DELETE FROM ledger.quarantine q USING ledger.batch_ranges r
WHERE r.batch_id = :batch_id AND q.pipeline = r.pipeline AND q.topic = r.topic AND q.partition = r.partition
  AND q."offset" >= r.from_offset AND q."offset" < r.until_offset;

-- name: replay_upsert
-- A replayed record replaces a row only where that row's value came from the replayed ranges
-- (or the key is absent): newer values from later offsets are kept.
INSERT INTO {schema}.{table} AS t ({columns}, _topic, _partition, _offset, _batch_id)
SELECT DISTINCT ON ({key}) {columns}, _topic, _partition, _offset, _batch_id
FROM ledger_staging.{staging}
ORDER BY {key}, _offset DESC, _partition DESC
ON CONFLICT ({key}) DO UPDATE SET {set_list}
WHERE EXISTS (SELECT 1 FROM ledger.batch_ranges r
              WHERE r.batch_id = :batch_id AND r.topic = t._topic AND r.partition = t._partition
                AND t._offset >= r.from_offset AND t._offset < r.until_offset);

-- name: replay_diff
-- Dry run: staged rows against the target rows of the same source coordinates.
WITH current AS (
    SELECT t._topic, t._partition, t._offset, ({columns}) AS v
    FROM {schema}.{table} t JOIN ledger.batch_ranges r
      ON r.batch_id = :batch_id AND t._topic = r.topic AND t._partition = r.partition
     AND t._offset >= r.from_offset AND t._offset < r.until_offset
), staged AS (
    SELECT _topic, _partition, _offset, ({columns}) AS v FROM ledger_staging.{staging}
)
SELECT count(*) FILTER (WHERE c._offset IS NULL) AS added,
       count(*) FILTER (WHERE s._offset IS NULL) AS removed,
       count(*) FILTER (WHERE c._offset IS NOT NULL AND s._offset IS NOT NULL AND c.v IS DISTINCT FROM s.v) AS changed,
       count(*) FILTER (WHERE c._offset IS NOT NULL AND s._offset IS NOT NULL AND c.v IS NOT DISTINCT FROM s.v) AS unchanged
FROM current c FULL JOIN staged s ON c._topic = s._topic AND c._partition = s._partition AND c._offset = s._offset;
