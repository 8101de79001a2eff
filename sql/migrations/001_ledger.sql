-- The offset ledger. Constraints make wrong states impossible where PostgreSQL can say so.
CREATE EXTENSION IF NOT EXISTS btree_gist;
CREATE SCHEMA IF NOT EXISTS ledger_staging;

CREATE TABLE IF NOT EXISTS ledger.batches (
    batch_id         bigserial PRIMARY KEY,
    pipeline         text        NOT NULL,
    kind             text        NOT NULL DEFAULT 'live' CHECK (kind IN ('live', 'backfill', 'replay')),
    status           text        NOT NULL DEFAULT 'planned'
                                 CHECK (status IN ('planned', 'staged', 'committed', 'failed', 'abandoned')),
    attempt          integer     NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    staging_table    text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    staged_at        timestamptz,
    committed_at     timestamptz,
    records_read     bigint CHECK (records_read >= 0),
    rows_written     bigint CHECK (rows_written >= 0),
    rows_quarantined bigint CHECK (rows_quarantined >= 0),
    error            text,
    UNIQUE (batch_id, pipeline, kind),
    CHECK (status NOT IN ('staged', 'committed')
           OR (staging_table IS NOT NULL AND records_read = rows_written + rows_quarantined)),
    CHECK ((status = 'committed') = (committed_at IS NOT NULL))
);

-- One unfinished live batch per pipeline: a second planner cannot start another.
CREATE UNIQUE INDEX IF NOT EXISTS batches_one_open_live
    ON ledger.batches (pipeline) WHERE kind = 'live' AND status IN ('planned', 'staged', 'failed');
CREATE INDEX IF NOT EXISTS batches_pipeline_recent ON ledger.batches (pipeline, batch_id DESC);

CREATE TABLE IF NOT EXISTS ledger.batch_ranges (
    batch_id     bigint  NOT NULL,
    pipeline     text    NOT NULL,
    kind         text    NOT NULL,
    topic        text    NOT NULL,
    partition    integer NOT NULL CHECK (partition >= 0),
    from_offset  bigint  NOT NULL CHECK (from_offset >= 0),
    until_offset bigint  NOT NULL,
    records_read bigint CHECK (records_read >= 0 AND records_read <= until_offset - from_offset),
    committed    boolean NOT NULL DEFAULT false,
    PRIMARY KEY (batch_id, topic, partition),
    FOREIGN KEY (batch_id, pipeline, kind) REFERENCES ledger.batches (batch_id, pipeline, kind),
    CHECK (from_offset <= until_offset),
    -- Committed live ranges never overlap: each offset is delivered by exactly one batch.
    EXCLUDE USING gist (pipeline WITH =, topic WITH =, partition WITH =,
                        int8range(from_offset, until_offset) WITH &&)
        WHERE (committed AND kind = 'live')
);

CREATE TABLE IF NOT EXISTS ledger.cursors (
    pipeline      text        NOT NULL,
    topic         text        NOT NULL,
    partition     integer     NOT NULL CHECK (partition >= 0),
    start_offset  bigint      NOT NULL CHECK (start_offset >= 0),
    next_offset   bigint      NOT NULL,
    last_batch_id bigint REFERENCES ledger.batches (batch_id),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pipeline, topic, partition),
    CHECK (next_offset >= start_offset),
    CHECK ((next_offset = start_offset) = (last_batch_id IS NULL))
);

CREATE TABLE IF NOT EXISTS ledger.quarantine (
    batch_id       bigint      NOT NULL REFERENCES ledger.batches (batch_id),
    pipeline       text        NOT NULL,
    topic          text        NOT NULL,
    partition      integer     NOT NULL,
    "offset"       bigint      NOT NULL,
    key            bytea,
    value          bytea,
    error          text        NOT NULL,
    quarantined_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pipeline, topic, partition, "offset")
);
CREATE INDEX IF NOT EXISTS quarantine_batch ON ledger.quarantine (batch_id);
