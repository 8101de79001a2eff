-- Target mode `upsert` with `target.version` (plugins/ledgerbatch/commit/modes/versioned.py): a key's
-- newest change wins by its version, ties by the higher coordinate ({newest} orders them newest first).
-- After newest_rows or newest_changes, lb_last_changes holds each key's change that applies; the apply
-- steps of mode_upsert.sql then write it.

-- name: newest_rows
-- Each key's newest row in the batch, where it is at least as new as the key's row in the target (as new:
-- the same record delivered again, whose value a replay may have corrected). A row delivered before
-- target.version was set has no version: any change is newer.
CREATE TEMPORARY TABLE lb_last_changes ON COMMIT DROP AS
SELECT c.* FROM (
    SELECT DISTINCT ON ({key}) {columns}, 'u' AS _change, _topic, _partition, _offset, _batch_id
    FROM ledger_staging.{staging}
    ORDER BY {key}, {newest}) c
LEFT JOIN {schema}.{table} t ON {match_t}
WHERE t.{version} IS NULL
   OR ROW(c.{version}, c._offset, c._partition, c._topic) >= ROW(t.{version}, t._offset, t._partition, t._topic);

-- name: newest_changes
-- Each key's newest change in the batch, where it is at least as new as the key's last change delivered:
-- its row, or its delete (ledger_deletes keeps the version). So an upsert older than a delete never brings
-- the row back, and a delete older than the row never removes it.
CREATE TEMPORARY TABLE lb_last_changes ON COMMIT DROP AS
SELECT c.* FROM (
    SELECT DISTINCT ON ({key}) {columns}, _change, _topic, _partition, _offset, _batch_id
    FROM ledger_staging.{staging}
    WHERE _change <> 's'
    ORDER BY {key}, {newest}) c
LEFT JOIN {schema}.{table} t ON {match_t}
LEFT JOIN ledger_deletes.{deletes} d ON {match_d}
WHERE coalesce(t.{version}, d.{version}) IS NULL
   OR ROW(c.{version}, c._offset, c._partition, c._topic)
      >= ROW(coalesce(t.{version}, d.{version}), coalesce(t._offset, d._offset), coalesce(t._partition, d._partition),
             coalesce(t._topic, d._topic));

-- name: superseded_by_range
-- The batch's changes that do not apply: older than their key's newest, in the batch or delivered before.
SELECT s._topic AS topic, s._partition AS partition, count(*) AS rows, count(*) FILTER (WHERE {is_delete}) AS deletes
FROM ledger_staging.{staging} s
WHERE {is_change}
  AND NOT EXISTS (SELECT 1 FROM lb_last_changes c
                  WHERE c._topic = s._topic AND c._partition = s._partition AND c._offset = s._offset)
GROUP BY s._topic, s._partition;

-- name: versioned_diff
-- Dry run of a versioned replay, after newest_rows or newest_changes: what its applying changes would do,
-- and the rows of its ranges whose key it no longer changes, which replay_drop_stale* removes.
SELECT count(*) FILTER (WHERE c._change = 'u' AND t._offset IS NULL) AS added,
       count(*) FILTER (WHERE c._change = 'd' AND t._offset IS NOT NULL)
       + (SELECT count(*) FROM {schema}.{table} t
          JOIN unnest(CAST(:topics AS text[]), CAST(:partitions AS integer[]), CAST(:from_offsets AS bigint[]),
                      CAST(:until_offsets AS bigint[])) AS r(topic, partition, from_offset, until_offset)
            ON t._topic = r.topic AND t._partition = r.partition AND t._offset >= r.from_offset AND t._offset < r.until_offset
          WHERE NOT EXISTS (SELECT 1 FROM ledger_staging.{staging} c WHERE {is_change_c} AND {match_t})) AS removed,
       count(*) FILTER (WHERE c._change = 'u' AND t._offset IS NOT NULL AND ROW({columns_c}) IS DISTINCT FROM ROW({columns_t})) AS changed,
       count(*) FILTER (WHERE c._change = 'u' AND t._offset IS NOT NULL AND ROW({columns_c}) IS NOT DISTINCT FROM ROW({columns_t})) AS unchanged
FROM lb_last_changes c LEFT JOIN {schema}.{table} t ON {match_t};
