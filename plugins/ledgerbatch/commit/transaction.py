"""The commit: ONE PostgreSQL transaction that moves staged rows into the target and advances the cursors.

Read it top to bottom like a script. Either every step happens or none does; a commit that
already happened is a no-op; a cursor that moved under us (a newer attempt, another runner)
rolls everything back.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.engine import Engine

from ledgerbatch.commit.modes.catalog import mode_for
from ledgerbatch.commit.rejects import publish_or_reject
from ledgerbatch.commit.target import lock_target
from ledgerbatch.errors import FencedError, LedgerbatchError, ReconcileError
from ledgerbatch.faults import crash_point, terminate_point
from ledgerbatch.ledger.batches import get_batch, lock_pipeline, mark_committed, mark_failed, record_replaced
from ledgerbatch.ledger.cursors import advance_cursors, range_kind
from ledgerbatch.ledger.quarantine import clear_quarantine, quarantine_staged
from ledgerbatch.model.batch import BatchKind, BatchStatus, RangeRefused
from ledgerbatch.model.reconcile import (
    Counts,
    check_error_budget,
    reconcile,
    reconcile_query,
    reconcile_ranges,
    set_aside_counts,
)
from ledgerbatch.model.shape import BatchShape
from ledgerbatch.spec.pipeline import PipelineSpec, check_version
from ledgerbatch.sqlfiles import query
from ledgerbatch.stage.tables import StagingTables, drop_finished_staging

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CommitResult:
    batch_id: int
    already_committed: bool
    rows_written: int
    rows_quarantined: int
    seconds: float
    rows_rejected: int = 0
    records_superseded: int = 0
    waited: float = 0.0  # of `seconds`, waiting for the target's commit lock, the batch and (replays, backfills)
    # the pipeline's lock: other commits, the upkeep's steps


def commit_batch(engine: Engine, spec: PipelineSpec, batch_id: int, attempt: int | None = None) -> CommitResult:
    try:
        return _commit(engine, spec, batch_id, attempt)
    except ReconcileError as exc:
        # The staged result cannot be committed: fail the attempt that was checked (never a newer one
        # that began meanwhile) so the next run re-reads the ranges.
        with engine.begin() as conn:
            checked = exc.attempt or attempt or get_batch(conn, batch_id).attempt
            mark_failed(conn, batch_id, checked, str(exc))
        raise


def _commit(engine: Engine, spec: PipelineSpec, batch_id: int, attempt: int | None) -> CommitResult:
    started = time.monotonic()
    with engine.begin() as conn:
        # 0. Under a statement_timeout, waiting for a lock ends as 55P03 before it (an outage: a user's lock, waited
        #    out) and a 57014 means a statement too slow for it (ops/outages.py); either rolls back the whole.
        conn.execute(text(query("lock_timeout_below_statement_timeout")))
        # 1. Take the target, then the batch: commits into one target (live, replay, backfill, any batch of
        #    the pipeline) run one after the other; every other committer of this batch waits here.
        locking = time.monotonic()
        lock_target(conn, spec)
        batch = get_batch(conn, batch_id, for_update=True)
        waited = time.monotonic() - locking
        if batch.pipeline != spec.name:
            raise LedgerbatchError(f"batch {batch_id} belongs to pipeline {batch.pipeline}, not {spec.name}")
        if batch.status == BatchStatus.COMMITTED:
            log.info("batch %d is already committed: nothing to do", batch_id)
            return CommitResult(batch_id, True, batch.rows_written, batch.rows_quarantined, time.monotonic() - started,
                                batch.rows_rejected, batch.records_superseded, waited)
        if batch.status != BatchStatus.STAGED:
            raise LedgerbatchError(f"batch {batch_id} is {batch.status}, not staged: process it first")
        if attempt is not None and batch.attempt != attempt:
            raise FencedError(f"batch {batch_id}: attempt {attempt} is stale, attempt {batch.attempt} owns the batch")
        check_version(spec, batch_id, batch.spec_version)  # staged under the spec it was planned with, or refused
        shape = BatchShape.recorded(spec, batch.output_schema)  # a query pipeline publishes the output it staged
        staging = StagingTables(batch.staging_table)

        # 2. Live: compare-and-set every cursor from `from` to `until`.
        #    Replay/backfill: the cursors stay; each range must still be what it was planned as.
        if batch.kind == BatchKind.LIVE:
            stale = advance_cursors(conn, spec.name, batch_id, batch.ranges)
            if stale:
                r = stale[0]
                raise FencedError(f"batch {batch_id}: cursor of {r.topic}[{r.partition}] is no longer at {r.from_offset}: fenced")
        else:
            locking = time.monotonic()
            lock_pipeline(conn, spec.name)
            waited += time.monotonic() - locking
            for r in batch.ranges:
                try:
                    kind = range_kind(conn, spec.name, r)
                except RangeRefused as exc:
                    raise FencedError(f"batch {batch_id}: {exc}") from None
                if kind != batch.kind:
                    raise FencedError(f"batch {batch_id}: {r} is now a {kind}, not a {batch.kind}: fenced")

        try:
            # 3. Shut out any straggling writer of this attempt, then reconcile what the ledger recorded
            #    with what staging holds (each staging table is unique on the coordinates).
            if not staging.complete(conn, shape):
                raise ReconcileError(f"batch {batch_id}: staging table {batch.staging_table} is missing or not in this "
                                     f"version's shape (dropped, staged by an earlier ledgerbatch, or before the spec's "
                                     f"columns changed): the next run stages it again")
            staging.lock(conn)
            if not shape.groups and staging.overlap(conn):
                raise ReconcileError(f"batch {batch_id}: staging table {batch.staging_table} holds offsets both as rows and as bad records")
            recorded = Counts(batch.records_read, batch.rows_written, batch.rows_quarantined, batch.rows_deleted,
                              batch.records_skipped)
            if spec.query is None:
                staged = staging.counts(conn)
                bad = sum(row.bad for row in staged)
                total = sum(row.rows for row in staged)
                deleted, skipped = staging.changes(conn) if shape.changes else (0, 0)
                reconcile(recorded, Counts(total, total - bad - deleted - skipped, bad, deleted, skipped))
                reconcile_ranges(batch.range_counts, {(row.topic, row.partition): row.rows for row in staged})
            else:
                # A query's output has no record per row: what was read per range was recorded
                # before the query (ledger/batches.py: staged_reads); staging holds its bad records and output.
                reconcile_query(batch, staging.bad_counts(conn), staging.rows(conn), shape.groups)
            check_error_budget(recorded, spec.error_policy, spec.max_error_ratio, spec.min_bad)

            # 4. A replay first takes out what earlier deliveries of its ranges quarantined: its own
            #    judgement of those records replaces theirs (a record refused again is quarantined again,
            #    once, with its current reason). Then publish the staged rows through the target mode (an
            #    append target takes a big batch's staging table as a partition), quarantining rows the
            #    target refuses (rejects.py), and move bad records into quarantine.
            cleared = clear_quarantine(conn, batch_id) if batch.kind != BatchKind.LIVE else 0
            mode = mode_for(spec)
            mode.ensure_target(conn, spec, shape)
            published = publish_or_reject(conn, mode, spec, shape, batch)
            recorded = set_aside_counts(recorded, get_batch(conn, batch_id))  # refused or superseded rows
            if published.rejected:
                check_error_budget(recorded, spec.error_policy, spec.max_error_ratio, spec.min_bad)
            if batch.kind != BatchKind.LIVE:
                record_replaced(conn, batch_id, published.removed + cleared)
            quarantined = quarantine_staged(conn, staging.bad, batch_id, spec.name)
            if quarantined != recorded.rows_quarantined:
                raise ReconcileError(f"batch {batch_id}: quarantined {quarantined} rows, expected {recorded.rows_quarantined}")
        except ReconcileError as exc:
            exc.attempt = batch.attempt  # the attempt checked here, for commit_batch to fail
            raise

        # 5. Mark committed and drop what is left of staging.
        mark_committed(conn, batch_id)
        staging.drop(conn)
        crash_point("before_commit")
        terminate_point(conn, "before_commit")
    crash_point("after_commit")
    # Earlier attempts' tables may still be locked by a stalled attempt: drop them outside the commit.
    drop_finished_staging(engine, spec.name)
    seconds = time.monotonic() - started
    aside = "".join(f", {n} {why}" for n, why in ((recorded.rows_rejected, "refused by the target"),
                                                  (recorded.records_superseded, "superseded by newer versions")) if n)
    log.info("%s batch %d committed: %d rows written, %d quarantined%s (commit %.2fs, %.2fs of it waiting for the "
             "target's lock)", batch.kind, batch_id, recorded.rows_written, recorded.rows_quarantined, aside, seconds,
             waited)
    return CommitResult(batch_id, False, recorded.rows_written, recorded.rows_quarantined, seconds,
                        recorded.rows_rejected, recorded.records_superseded, waited)
