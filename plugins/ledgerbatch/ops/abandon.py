"""`ledgerbatch abandon`: give up an unfinished batch on purpose, e.g. one planned under a spec version it
can no longer finish with (spec.check_version). Nothing of it was committed; the next run plans a live
batch's offsets again, under the spec as it is now. The abandoned batch stays in the ledger with why."""
from __future__ import annotations

import logging

from sqlalchemy.engine import Engine

from ledgerbatch.errors import LedgerbatchError, require
from ledgerbatch.ledger.batches import get_batch, mark_abandoned
from ledgerbatch.model.batch import Batch, BatchStatus
from ledgerbatch.spec.pipeline import PipelineSpec
from ledgerbatch.stage.tables import drop_finished_staging

log = logging.getLogger(__name__)


def abandon_batch(engine: Engine, spec: PipelineSpec, batch_id: int, by: str, reason: str | None) -> Batch:
    require(by, "who abandons the batch (--by NAME)")
    with engine.begin() as conn:
        batch = get_batch(conn, batch_id, for_update=True)  # a committer of it waits, or has finished
        if batch.pipeline != spec.name:
            raise LedgerbatchError(f"batch {batch_id} belongs to pipeline {batch.pipeline}, not {spec.name}")
        if batch.status in (BatchStatus.COMMITTED, BatchStatus.ABANDONED):
            raise LedgerbatchError(f"batch {batch_id} is {batch.status}: there is nothing to abandon")
        mark_abandoned(conn, batch_id, f"abandoned by {by}" + (f": {reason}" if reason else ""))
    drop_finished_staging(engine, spec.name)
    log.warning("%s: abandoned %s batch %d (%s), by %s", spec.name, batch.kind, batch_id, batch.status, by)
    return batch
