-- Target mode `upsert` (plugins/ledgerbatch/modes/upsert.py).

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
