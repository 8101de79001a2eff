-- Replay dry runs: the staged rows against the target, nothing changed.

-- name: replay_diff
-- Dry run: staged rows against the target rows of the same source coordinates.
WITH current AS (
    SELECT t._topic, t._partition, t._offset, ({columns}) AS v
    FROM {schema}.{table} t JOIN unnest(CAST(:topics AS text[]), CAST(:partitions AS integer[]), CAST(:from_offsets AS bigint[]),
                CAST(:until_offsets AS bigint[])) AS r(topic, partition, from_offset, until_offset)
      ON t._topic = r.topic AND t._partition = r.partition
     AND t._offset >= r.from_offset AND t._offset < r.until_offset
), staged AS (
    SELECT _topic, _partition, _offset, ({columns}) AS v FROM ledger_staging.{staging}
)
SELECT count(*) FILTER (WHERE c._offset IS NULL) AS added,
       count(*) FILTER (WHERE s._offset IS NULL) AS removed,
       count(*) FILTER (WHERE c._offset IS NOT NULL AND s._offset IS NOT NULL AND c.v IS DISTINCT FROM s.v) AS changed,
       count(*) FILTER (WHERE c._offset IS NOT NULL AND s._offset IS NOT NULL AND c.v IS NOT DISTINCT FROM s.v) AS unchanged
FROM current c FULL JOIN staged s ON c._topic = s._topic AND c._partition = s._partition AND c._offset = s._offset;
