"""What committing a staged replay would change in the target: the diff a dry run or a reviewer sees."""
from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlalchemy.engine import Engine

from ledgerbatch.commit.modes.catalog import mode_for
from ledgerbatch.errors import LedgerbatchError
from ledgerbatch.ledger.batches import get_batch, mark_abandoned
from ledgerbatch.model.batch import BatchStatus
from ledgerbatch.model.shape import BatchShape
from ledgerbatch.spec.pipeline import PipelineSpec
from ledgerbatch.stage.tables import drop_finished_staging

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Diff:
    added: int
    removed: int
    changed: int
    unchanged: int
    quarantined: int


def staged_diff(engine: Engine, spec: PipelineSpec, batch_id: int) -> Diff:
    """What committing a staged replay would do to the target; the batch stays staged."""
    with engine.begin() as conn:
        return _diff(conn, spec, batch_id)


def dry_run_diff(engine: Engine, spec: PipelineSpec, batch_id: int) -> Diff:
    """Compare a staged replay with the target, then abandon it: the target is not touched."""
    with engine.begin() as conn:
        diff = _diff(conn, spec, batch_id)
        mark_abandoned(conn, batch_id, f"dry run: {diff}")
    drop_finished_staging(engine, spec.name)
    log.info("dry run of batch %d: %s", batch_id, diff)
    return diff


def _diff(conn, spec: PipelineSpec, batch_id: int) -> Diff:
    batch = get_batch(conn, batch_id, for_update=True)  # a committer of it waits, or has finished
    if batch.status != BatchStatus.STAGED:
        raise LedgerbatchError(f"batch {batch_id} is {batch.status}, not staged")
    row = mode_for(spec).diff(conn, spec, BatchShape.recorded(spec, batch.output_schema), batch)
    return Diff(row.added, row.removed, row.changed, row.unchanged, batch.rows_quarantined)
