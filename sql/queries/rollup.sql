-- Partition rollup (plugins/ledgerbatch/commit/modes/rollup.py), besides mode_append.sql's
-- create_merged_partition ... attach_merged_partition and target.sql's table_checks / add_check.

-- name: drop_merged_check
-- LIKE ... INCLUDING CONSTRAINTS copies a CHECK the target has NOT VALID as a validated one; the rows the target
-- holds already (which that CHECK never judged) are copied without it, and it comes back NOT VALID after the
-- copy (add_check), as the target has it: a rollup merges the target's rows as they are.
ALTER TABLE {schema}.{merged} DROP CONSTRAINT {constraint};
