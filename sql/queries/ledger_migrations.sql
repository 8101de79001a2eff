-- The ledger schema's own bookkeeping of migrations. Run only by plugins/ledgerbatch/ledger/migrations.py.

-- name: bootstrap
CREATE SCHEMA IF NOT EXISTS ledger;
CREATE TABLE IF NOT EXISTS ledger.schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: migration_lock
SELECT pg_advisory_xact_lock(hashtext('ledgerbatch:migrate'));

-- name: applied_migrations
SELECT version FROM ledger.schema_migrations;

-- name: record_migration
INSERT INTO ledger.schema_migrations (version, name) VALUES (:version, :name);

-- name: ledger_exists
SELECT to_regclass('ledger.schema_migrations') IS NOT NULL;
