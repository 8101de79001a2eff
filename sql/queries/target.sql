-- Target tables: introspection and evolution (plugins/ledgerbatch/commit/target.py, commit/modes/).
-- {placeholders} take quoted identifiers; {type} is a fixed type name from the type map.

-- name: target_lock
-- Held by every commit into the target until it ends (commit/target.py: lock_target).
SELECT pg_advisory_xact_lock(hashtext('ledgerbatch:target:' || :target));

-- name: table_columns
-- Each column with its full type as PostgreSQL writes it (numeric(12,2), text[], jsonb, ...), and what an
-- INSERT that leaves it out writes: `fill`, the DEFAULT (an identity column's: the next value of its
-- sequence), or with `generated` the expression of a generated column.
SELECT a.attname AS column_name, format_type(a.atttypid, a.atttypmod) AS type, a.attnotnull AS not_null,
       a.attgenerated = 's' AS generated,
       CASE WHEN a.attidentity <> '' THEN
                 'nextval(' || quote_literal(pg_get_serial_sequence(quote_ident(:schema) || '.' || quote_ident(:table),
                                                                    a.attname)) || '::regclass)'
            ELSE pg_get_expr(d.adbin, d.adrelid) END AS fill
FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE a.attrelid = to_regclass(quote_ident(:schema) || '.' || quote_ident(:table))
  AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum;

-- name: table_exists
SELECT to_regclass(quote_ident(:schema) || '.' || quote_ident(:table)) IS NOT NULL;

-- name: add_column
-- target.evolve additive: a column new to the spec, nullable, inside the commit's transaction.
ALTER TABLE {schema}.{table} ADD COLUMN {column} {type};

-- name: add_filled_column
-- A column filled as an INSERT that leaves it out fills it ({fill}: the DEFAULT, evaluated for every row where
-- it is volatile), and then without the DEFAULT: the table's own DEFAULT stays the one that applies.
ALTER TABLE {schema}.{table} ADD COLUMN {column} {type} DEFAULT {fill};
ALTER TABLE {schema}.{table} ALTER COLUMN {column} DROP DEFAULT;

-- name: add_generated_column
ALTER TABLE {schema}.{table} ADD COLUMN {column} {type} GENERATED ALWAYS AS ({fill}) STORED;

-- name: set_column_type
ALTER TABLE {schema}.{table} ALTER COLUMN {column} TYPE {type};

-- name: set_not_null
ALTER TABLE {schema}.{table} ALTER COLUMN {column} SET NOT NULL;

-- name: table_checks
-- A table's CHECK constraints as the server writes them, which a partition must carry too.
SELECT conname AS name, pg_get_constraintdef(oid) AS definition
FROM pg_constraint
WHERE conrelid = to_regclass(quote_ident(:schema) || '.' || quote_ident(:table)) AND contype = 'c' AND NOT connoinherit
ORDER BY conname;

-- name: add_check
ALTER TABLE {schema}.{table} ADD CONSTRAINT {constraint} {definition};

-- name: target_layout
-- Whether the target is partitioned, whether this login may attach to it (owner, CREATE in schema), and
-- whether the user gave it triggers (ATTACH fires none: their rows are copied so that the triggers see them).
SELECT c.relkind = 'p' AS partitioned,
       pg_has_role(c.relowner, 'USAGE') AND has_schema_privilege(n.oid, 'CREATE') AS can_attach,
       EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = c.oid AND NOT t.tgisinternal) AS has_triggers
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = :schema AND c.relname = :table;

-- name: count_rows
SELECT count(*) AS rows, count(DISTINCT (_topic, _partition, _offset)) AS distinct_coordinates FROM {schema}.{table};
