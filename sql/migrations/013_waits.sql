-- batch.min_records (plan/live.py: filling): since when a pipeline's planner has held fewer pending offsets
-- than min_records back, by the database's clock. batch.max_delay counts from here as well as from the
-- oldest pending record's timestamp, so a producer whose clock runs ahead cannot hold records back longer
-- than max_delay. The row goes when a batch is planned.
CREATE TABLE IF NOT EXISTS ledger.waits (
    pipeline text        PRIMARY KEY,
    since    timestamptz NOT NULL DEFAULT now()
);

GRANT SELECT ON ledger.waits TO ledgerbatch_inspector;
GRANT SELECT, INSERT, DELETE ON ledger.waits TO ledgerbatch_writer;
