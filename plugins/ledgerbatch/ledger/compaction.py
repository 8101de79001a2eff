"""Ledger compaction and quarantine retention (sql/queries/ledger_compact.sql; migrations 014, 015).

Compaction folds a pipeline's batches that finished before a time into one checkpoint per partition
(`ledger.checkpoints`: the live offsets `[from, until)` they delivered, the records they read, and exactly
the offsets their backfills delivered, `backfilled`) and one row of summed counts (`ledger.compactions`),
then deletes them with their ranges, in bounded steps (next_step: ops/history.py runs each in its own
brief transaction). Every question "was offset o delivered" (ledger_cursors.sql:
delivered_overlap) has the same answer afterwards, so a gap below the start that no batch delivered stays
backfillable. `verify` reads both, so it still proves tiling and counts. Quarantine retention deletes old
bad records and keeps their count."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.engine import Connection, Engine

from ledgerbatch.ledger.sql import run
from ledgerbatch.model.ranges import OffsetRange


@dataclass(frozen=True)
class Fold:
    folded: int  # the pipeline's batches up to this id were folded before
    through: int  # and now up to this one

    @property
    def empty(self) -> bool:
        return self.through <= self.folded

    def params(self, pipeline: str) -> dict:
        return {"pipeline": pipeline, "folded": self.folded, "through": self.through}


def lock_compaction(conn: Connection, pipeline: str) -> None:
    run(conn, "compaction_lock", {"pipeline": pipeline})


def foldable(conn: Connection, pipeline: str, before: datetime) -> Fold:
    """What may fold now: every batch up to the first one still unfinished, or finished at `before` or later."""
    folded = run(conn, "folded_through", {"pipeline": pipeline}).scalar_one()
    through = run(conn, "foldable_through", {"pipeline": pipeline, "folded": folded, "before": before}).scalar_one()
    return Fold(folded, through)


def next_step(conn: Connection, pipeline: str, through: int, batches: int) -> Fold:
    """One bounded step of a fold up to `through`: from what is folded now to at most `batches` batches
    further. A prefix of what may fold is itself foldable (as with an earlier cut-off), so each step leaves
    the ledger exact."""
    folded = run(conn, "folded_through", {"pipeline": pipeline}).scalar_one()
    step = run(conn, "fold_step_through", {"pipeline": pipeline, "folded": folded, "through": through,
                                           "batches": batches}).scalar_one()
    return Fold(folded, step)


def fold(conn: Connection, pipeline: str, f: Fold, deletes_folded: int, horizon: bool) -> int:
    """Fold the batches of `f` into the checkpoints and the pipeline's counts and delete them; returns how many
    batches went. `horizon`: replays of the folded offsets are refused from now on (model/batch.py: classify)."""
    run(conn, "fold_checkpoints", {**f.params(pipeline), "horizon": horizon})
    run(conn, "fold_counts", {**f.params(pipeline), "deletes": deletes_folded})
    return run(conn, "delete_folded", f.params(pipeline)).rowcount


def backfill_gaps(conn: Connection, pipeline: str) -> list[OffsetRange]:
    """The offsets a backfill may still deliver: per partition, those between the log start the last plan
    saw (or 0) and the pipeline's start that no committed batch delivered. A change pipeline keeps its
    deletes while there are any (commit/modes/upsert.py: fold_history): a backfill's change of a deleted key
    must lose to the delete, as it would have before compaction."""
    return [OffsetRange(g.topic, g.partition, g.from_offset, g.until_offset)
            for g in run(conn, "backfill_gaps", {"pipeline": pipeline})]


def vacuum(engine: Engine) -> None:
    """VACUUM the tables compaction deletes from, so their space is reused at once (autovacuum may be late, or off)."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        run(conn, "vacuum_ledger")


def purge_quarantine(conn: Connection, pipeline: str, before: datetime) -> int:
    """Delete the pipeline's bad records quarantined before `before`, counting them; returns how many."""
    return run(conn, "purge_quarantine", {"pipeline": pipeline, "before": before}).scalar_one()


def detailed_from(conn: Connection, pipeline: str) -> int:
    """The first batch id whose records `verify --deep` can still compare one by one: below it batches were
    compacted, or their bad records purged."""
    return run(conn, "checked_in_detail_from", {"pipeline": pipeline}).scalar_one()
