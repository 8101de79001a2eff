-- Target mode `aggregate` (plugins/ledgerbatch/commit/modes/aggregate.py). {contributions} is the
-- pipeline's table in ledger_aggregates: each committed batch's result per group. {merge_list}
-- {measures_agg} ("sum(c.x) AS x, ...") and {differs} ("c.x IS DISTINCT FROM r.x OR ...") are
-- rendered from validated column names and the fixed merges sum|min|max.

-- name: create_target_aggregate
CREATE TABLE IF NOT EXISTS {schema}.{table} (
    {defs},  -- key and measure columns, then the batch that last changed the group
    _batch_id bigint NOT NULL,
    PRIMARY KEY ({key})
);

-- name: create_contributions
CREATE TABLE IF NOT EXISTS ledger_aggregates.{contributions} (
    _batch_id bigint NOT NULL,
    {defs},
    PRIMARY KEY (_batch_id, {key})
);
CREATE INDEX IF NOT EXISTS {key_index} ON ledger_aggregates.{contributions} ({key});

-- name: insert_contributions
INSERT INTO ledger_aggregates.{contributions} (_batch_id, {columns})
SELECT _batch_id, {columns} FROM ledger_staging.{staging};

-- name: merge_groups
-- A batch of new offsets: each group's values merge into the target's (sum adds, min and max keep
-- the extreme; NULL only where both are NULL), independent of how much history there is.
INSERT INTO {schema}.{table} AS t ({columns}, _batch_id)
SELECT {columns}, _batch_id FROM ledger_staging.{staging}
ON CONFLICT ({key}) DO UPDATE SET {merge_list}, _batch_id = EXCLUDED._batch_id;

-- name: note_affected_groups
-- A replay: the groups that superseded batches or the new result touch.
CREATE TEMPORARY TABLE ledgerbatch_affected ON COMMIT DROP AS
SELECT {key} FROM ledger_aggregates.{contributions} WHERE _batch_id = ANY(CAST(:superseded AS bigint[]))
UNION
SELECT {key} FROM ledger_staging.{staging};

-- name: delete_contributions
DELETE FROM ledger_aggregates.{contributions} WHERE _batch_id = ANY(CAST(:superseded AS bigint[]));

-- name: recompute_groups
-- The affected groups from their contributions; a group no contribution is left for disappears.
DELETE FROM {schema}.{table} t USING ledgerbatch_affected a WHERE ({key_t}) = ({key_a});
INSERT INTO {schema}.{table} ({key}, {measures}, _batch_id)
SELECT {key}, {measures_agg}, max(c._batch_id)
FROM ledger_aggregates.{contributions} c JOIN ledgerbatch_affected a USING ({key})
GROUP BY {key};

-- name: aggregate_diff
-- Dry run of a replay: the affected groups as they would be recomputed against the target now.
WITH contributions AS (
    SELECT {key}, {measures} FROM ledger_aggregates.{contributions}
    WHERE _batch_id <> ALL(CAST(:superseded AS bigint[]))
    UNION ALL
    SELECT {key}, {measures} FROM ledger_staging.{staging}
), affected AS (
    SELECT {key} FROM ledger_aggregates.{contributions} WHERE _batch_id = ANY(CAST(:superseded AS bigint[]))
    UNION
    SELECT {key} FROM ledger_staging.{staging}
), recomputed AS (
    SELECT {key}, {measures_agg}, true AS _present FROM contributions c JOIN affected a USING ({key}) GROUP BY {key}
), current AS (
    SELECT t.* FROM {schema}.{table} t JOIN affected a USING ({key})
)
SELECT count(*) FILTER (WHERE c._batch_id IS NULL) AS added,
       count(*) FILTER (WHERE r._present IS NULL) AS removed,
       count(*) FILTER (WHERE c._batch_id IS NOT NULL AND r._present AND ({differs})) AS changed,
       count(*) FILTER (WHERE c._batch_id IS NOT NULL AND r._present AND NOT ({differs})) AS unchanged
FROM current c FULL JOIN recomputed r USING ({key});
