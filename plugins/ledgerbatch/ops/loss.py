"""Acknowledging data loss: offsets deleted from Kafka (retention) before the pipeline delivered them.

Nothing is ever skipped silently: the pipeline stops with a DataLossError until an operator runs
`ledgerbatch acknowledge-loss`, which records each lost range (who, when, how many offsets, why) in
`ledger.lost_ranges`, abandons the unfinished batch that can no longer be read, and moves the
affected cursors to the log start. A staged batch needs nothing from Kafka: it is committed first, so
only what is really gone is recorded as lost.
"""
from __future__ import annotations

import logging

from sqlalchemy.engine import Engine

from ledgerbatch.commit.modes.rollup import bound_partitions
from ledgerbatch.commit.transaction import commit_batch
from ledgerbatch.errors import LedgerbatchError, require
from ledgerbatch.ledger.batches import get_batch, lock_pipeline, mark_abandoned, open_live_batch_id
from ledgerbatch.ledger.cursors import get_cursors, record_lost_range
from ledgerbatch.model.batch import BatchStatus
from ledgerbatch.model.ranges import OffsetRange
from ledgerbatch.source import kafka
from ledgerbatch.spec.pipeline import PipelineSpec
from ledgerbatch.stage.tables import drop_finished_staging

log = logging.getLogger(__name__)


def lost_ranges(cursors: dict, ends: dict) -> list[OffsetRange]:
    """[cursor, log start) of every partition whose cursor fell out of the log (pure)."""
    return [OffsetRange(t, p, pos, ends[(t, p)].low) for (t, p), pos in sorted(cursors.items())
            if (t, p) in ends and pos < ends[(t, p)].low]


def acknowledge_loss(engine: Engine, spec: PipelineSpec, bootstrap_servers: str, by: str, reason: str | None) -> list[OffsetRange]:
    require(by, "who acknowledges the loss (--by NAME)")
    ends = kafka.watermarks(bootstrap_servers, spec.topics, dict(spec.kafka_options))
    _commit_staged(engine, spec)
    with engine.begin() as conn:
        lock_pipeline(conn, spec.name)
        lost = lost_ranges(get_cursors(conn, spec.name), ends)
        if not lost:
            raise LedgerbatchError(f"{spec.name}: nothing is lost, every cursor is inside the log")
        open_id = open_live_batch_id(conn, spec.name)
        if open_id is not None and get_batch(conn, open_id).status == BatchStatus.STAGED:
            raise LedgerbatchError(f"batch {open_id} was staged meanwhile: run acknowledge-loss again to commit it first")
        if open_id is not None:
            mark_abandoned(conn, open_id, f"abandoned: offsets lost from Kafka, acknowledged by {by}")
            log.warning("abandoned unfinished batch %d: its ranges are no longer fully in Kafka", open_id)
        for r in lost:
            if not record_lost_range(conn, spec.name, r, by, reason):
                raise LedgerbatchError(f"{r}: the cursor moved meanwhile; run again")
            log.warning("%s: %d offsets lost, acknowledged by %s", r, r.span, by)
    if open_id is not None:  # its attempt's staging tables, else verify names them orphans
        drop_finished_staging(engine, spec.name)
    return lost


def _commit_staged(engine: Engine, spec: PipelineSpec) -> None:
    """The unfinished live batch, when staged, holds every record it read: commit it (the cursors move past
    its ranges), so that only offsets no batch holds are recorded as lost."""
    with engine.connect() as conn:
        open_id = open_live_batch_id(conn, spec.name)
        staged = open_id is not None and get_batch(conn, open_id).status == BatchStatus.STAGED
    if staged:
        result = commit_batch(engine, spec, open_id)
        bound_partitions(engine, spec)  # as every commit: a batch attached as a partition may put it over its bound
        log.warning("committed staged batch %d before acknowledging the loss (%d rows, %d quarantined): it needs "
                    "nothing from Kafka", open_id, result.rows_written, result.rows_quarantined)
