-- Cursors moved on purpose (issue #23, `ledgerbatch offsets --set`; ops/offsets.py): every move is a row,
-- written in the transaction that moves the cursor, so the ledger still explains every offset. Offsets
-- skipped forward are ranges of ledger.lost_ranges of kind 'skipped' (tiles, as lost ones are: verify
-- accounts for them); a move back is only allowed over skipped offsets, and trims them.
CREATE TABLE IF NOT EXISTS ledger.offset_moves (
    move_id     bigserial   PRIMARY KEY,
    pipeline    text        NOT NULL,
    topic       text        NOT NULL,
    partition   integer     NOT NULL CHECK (partition >= 0),
    from_offset bigint,     -- NULL: the pipeline had no cursor there; the move is where it starts
    to_offset   bigint      NOT NULL CHECK (to_offset >= 0),
    moved_by    text        NOT NULL CHECK (btrim(moved_by) <> ''),
    reason      text        NOT NULL CHECK (btrim(reason) <> ''),
    request     text        NOT NULL,  -- what was asked: to-time ..., to-offset ..., to-earliest, to-latest
    moved_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS offset_moves_pipeline ON ledger.offset_moves (pipeline, move_id DESC);

ALTER TABLE ledger.lost_ranges
    ADD COLUMN IF NOT EXISTS kind text NOT NULL DEFAULT 'lost' CHECK (kind IN ('lost', 'skipped')),
    ADD COLUMN IF NOT EXISTS move_id bigint REFERENCES ledger.offset_moves;

GRANT SELECT ON ledger.offset_moves TO ledgerbatch_inspector;
GRANT SELECT, INSERT ON ledger.offset_moves TO ledgerbatch_writer;
GRANT USAGE ON SEQUENCE ledger.offset_moves_move_id_seq TO ledgerbatch_writer;
GRANT DELETE ON ledger.lost_ranges TO ledgerbatch_writer;
