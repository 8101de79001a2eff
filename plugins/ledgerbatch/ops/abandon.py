"""`ledgerbatch abandon`: give up an unfinished batch on purpose, e.g. one planned under a spec version it
can no longer finish with (spec.check_version). Nothing of it was committed; the next run plans a live
batch's offsets again, under the spec as it is now. The abandoned batch stays in the ledger with why.

The upkeep abandons stranded replays and backfills by itself (abandon_stranded): compaction folds only up to
the first unfinished batch, so one that nobody will finish would stop it for good."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.engine import Engine

from ledgerbatch.errors import LedgerbatchError, require
from ledgerbatch.ledger.batches import get_batch, mark_abandoned
from ledgerbatch.ledger.sql import run
from ledgerbatch.model.batch import Batch, BatchKind, BatchStatus
from ledgerbatch.spec.pipeline import PipelineSpec
from ledgerbatch.stage.lease import LEASE_S
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


@dataclass(frozen=True)
class Stranded:
    batch_id: int
    kind: BatchKind
    was: BatchStatus  # planned, staged or failed
    attempt: int
    last_worked_on: datetime


def abandon_stranded(engine: Engine, spec: PipelineSpec, before: datetime, idle_s: float = LEASE_S) -> list[Stranded]:
    """Abandon the pipeline's replay and backfill batches that nobody will finish: planned, staged or failed,
    last worked on before `before` (the upkeep passes its compaction's cut-off, now - history.compact_after)
    and no attempt of them holding a lease renewed within `idle_s` seconds (nobody stages them now), nor being
    committed right now. An interrupted `verify --deep` or `ledgerbatch replay`, or a backfill DAG run that
    failed and was never cleared, leaves such a batch; compaction would stop at it for good. Live batches are
    never abandoned here (`run` resumes them). Each is logged; returns them."""
    reason = "abandoned by the upkeep: a replay or backfill nobody finished before the compaction's cut-off"
    with engine.begin() as conn:
        rows = run(conn, "abandon_stranded", {"pipeline": spec.name, "before": before, "idle_s": float(idle_s),
                                              "reason": reason}).all()
    stranded = [Stranded(r.batch_id, BatchKind(r.kind), BatchStatus(r.was), r.attempt, r.last_worked_on)
                for r in sorted(rows, key=lambda r: r.batch_id)]  # in batch order: UPDATE ... RETURNING has none
    for b in stranded:
        log.warning("%s: abandoned %s batch %d, %s at attempt %d and last worked on at %s (before the compaction's "
                    "cut-off %s) with nobody holding it: nobody will finish it, and compaction folds past it now",
                    spec.name, b.kind, b.batch_id, b.was, b.attempt, b.last_worked_on.isoformat(timespec="seconds"),
                    before.isoformat(timespec="seconds"))
    if stranded:
        drop_finished_staging(engine, spec.name)
    return stranded
