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

-- name: stored_spec_texts
-- The spec texts redact_spec_texts looks at (after the migrations: 007 made the table).
SELECT pipeline, version, spec_text FROM ledger.spec_versions ORDER BY pipeline, version FOR UPDATE;

-- name: rekey_spec_version
-- The redacted text under its own version; two texts differing only in a secret become one version, seen first
-- when the first of them was.
INSERT INTO ledger.spec_versions (pipeline, version, spec_text, first_seen)
SELECT pipeline, :new, :spec_text, first_seen FROM ledger.spec_versions WHERE pipeline = :pipeline AND version = :old
ON CONFLICT (pipeline, version) DO UPDATE SET spec_text = excluded.spec_text,
    first_seen = least(ledger.spec_versions.first_seen, excluded.first_seen);

-- name: repin_spec_version
UPDATE ledger.batches SET spec_version = :new WHERE pipeline = :pipeline AND spec_version = :old;

-- name: drop_spec_version
DELETE FROM ledger.spec_versions WHERE pipeline = :pipeline AND version = :old AND version <> :new;
