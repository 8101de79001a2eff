-- Rows the target refuses at publish (plugins/ledgerbatch/commit/rejects.py), inside the commit's transaction.

-- name: number_units
-- Every staged row numbered in the mode's order (an upsert key's rows next to each other), so that a probe
-- publishes a run of them through the view {slice}.
CREATE TABLE ledger_staging.{units} AS
SELECT row_number() OVER (ORDER BY {order}) AS _unit, s.* FROM ledger_staging.{staging} s;

-- name: index_units
CREATE INDEX ON ledger_staging.{units} (_unit);

-- name: slice_view
-- The run of rows a probe publishes; the bounds are transaction-local settings (set_slice), so one view
-- serves every probe.
CREATE VIEW ledger_staging.{slice} AS
SELECT {columns} FROM ledger_staging.{units}
WHERE _unit BETWEEN CAST(current_setting('ledgerbatch.slice_from') AS bigint)
                AND CAST(current_setting('ledgerbatch.slice_to') AS bigint);

-- name: set_slice
SELECT set_config('ledgerbatch.slice_from', :first, true), set_config('ledgerbatch.slice_to', :last, true);

-- name: breaking_units
-- The rows that break one CHECK or NOT NULL of the target ({breaks}: the server's own definition of it).
SELECT _unit FROM ledger_staging.{units} WHERE {breaks} ORDER BY _unit;

-- name: unit_coordinates
SELECT _topic AS topic, _partition AS partition, _offset AS "offset" FROM ledger_staging.{units} WHERE _unit = :unit;

-- name: rejected_by_range
SELECT _topic AS topic, _partition AS partition, count(*) AS rows, count(*) FILTER (WHERE {is_delete}) AS deletes
FROM ledger_staging.{units}
WHERE _unit = ANY(CAST(:units AS bigint[]))
GROUP BY 1, 2;

-- name: delete_rejected
-- The refused rows leave staging, and the rest of the transaction is told (ledgerbatch.pruned_staging): their
-- versions stay in the staging table until the commit, and an index built over it (an ATTACH's) would take
-- them too, so an append batch whose target has indexes of the user's is copied instead (mode_append.sql:
-- staging_pruned).
DELETE FROM ledger_staging.{staging} s
USING ledger_staging.{units} u
WHERE u._unit = ANY(CAST(:units AS bigint[]))
  AND s._topic = u._topic AND s._partition = u._partition AND s._offset = u._offset;
SELECT set_config('ledgerbatch.pruned_staging', :staging, true);

-- name: drop_units
DROP VIEW ledger_staging.{slice};
DROP TABLE ledger_staging.{units};

-- name: constraints_immediate
-- The publish checks deferred constraints at each statement, so that a row they refuse is found by the
-- probes like any other refusal instead of failing the COMMIT (or the ATTACH) of the whole batch.
SET CONSTRAINTS ALL IMMEDIATE;

-- name: constraints_restored
-- After the publish: the constraints that are INITIALLY DEFERRED are deferred again for the rest of the
-- commit's transaction.
DO $$
DECLARE deferred text;
BEGIN
    SELECT string_agg(DISTINCT format('%I.%I', n.nspname, c.conname), ', ') INTO deferred
    FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace
    WHERE c.condeferrable AND c.condeferred;
    IF deferred IS NOT NULL THEN
        EXECUTE 'SET CONSTRAINTS ' || deferred || ' DEFERRED';
    END IF;
END $$;

-- name: declared_constraint
-- The name of a refused constraint as the user declared it on the target: where the server names a
-- partition's copy of it (an append target's unique constraint or index), its parent's.
SELECT coalesce(
    (SELECT p.conname FROM pg_constraint c JOIN pg_constraint p ON p.oid = c.conparentid
     WHERE c.conname = :name AND c.connamespace = to_regnamespace(quote_ident(:schema)) LIMIT 1),
    (SELECT parent.relname FROM pg_class i JOIN pg_inherits h ON h.inhrelid = i.oid JOIN pg_class parent ON parent.oid = h.inhparent
     WHERE i.relname = :name AND i.relkind = 'i' AND i.relnamespace = to_regnamespace(quote_ident(:schema)) LIMIT 1),
    :name);
