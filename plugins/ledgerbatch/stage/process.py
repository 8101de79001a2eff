"""Processing one batch: take a new attempt, stage its ranges (driver.py), and turn a failure into
one typed error the runner and the operators act on."""
from __future__ import annotations

import logging
import re
import time

from sqlalchemy.engine import Engine

from ledgerbatch.config import libpq_dsn, staging_db_url
from ledgerbatch.errors import (
    FENCED,
    OFFSETS_LOST,
    OVER_BUDGET,
    BatchFailedError,
    DataLossError,
    FencedError,
    ReconcileError,
)
from ledgerbatch.ledger.batches import get_batch, mark_failed, pin_spec_version
from ledgerbatch.model.batch import Batch, BatchStatus
from ledgerbatch.model.reconcile import Counts, check_error_budget
from ledgerbatch.source.kafka import consumer_config
from ledgerbatch.spec.pipeline import PipelineSpec, check_version
from ledgerbatch.stage import transform
from ledgerbatch.stage.driver import plain, stage_batch, stage_in_turn
from ledgerbatch.stage.job import Parsing, StagingJob
from ledgerbatch.stage.lease import AttemptLease, begin_own_attempt, wait_for_holder
from ledgerbatch.stage.tables import StagingTables, drop_staging_quietly, open_staging
from ledgerbatch.stage.turns import Turns

log = logging.getLogger(__name__)
# A Python worker's traceback inside a Spark error, up to Spark's own SQLSTATE or JVM stack.
_TRACEBACK = re.compile(r"Traceback \(most recent call last\):\n(.*?)(?=\n\s*SQLSTATE|\n\tat |\Z)", re.S)


def process_batch(spark, engine: Engine, spec: PipelineSpec, batch_id: int, db_url: str, bootstrap_servers: str,
                  stall_timeout_s: float = 60.0, turns: Turns | None = None) -> Batch:
    """Stage batch `batch_id` under a new attempt; returns the staged batch. Raises if it cannot. `turns`: a
    service's (stage/turns.py), whose turns stage many pipelines' batches in one Spark job."""
    started = time.monotonic()
    with engine.begin() as conn:  # a replay or backfill takes the spec's version at its first attempt
        check_version(spec, batch_id, pin_spec_version(conn, batch_id, spec.name, spec.version, spec.canonical))
        batch = get_batch(conn, batch_id)
    if batch.status == BatchStatus.STAGED:  # e.g. a task retried after staging: commit what is there, never re-read
        log.info("batch %d is already staged by attempt %d: nothing to process", batch_id, batch.attempt)
        return batch
    shape = transform.batch_shape(spark, spec)  # a query's output, analysed before anything is read
    while True:
        with engine.begin() as conn:
            attempt = begin_own_attempt(conn, batch_id, shape.output_schema)  # judged on the locked row
            if attempt is not None:
                batch = get_batch(conn, batch_id)
                table = open_staging(conn, shape, batch_id, attempt, libpq_dsn(staging_db_url(db_url)))
                break
        batch = wait_for_holder(engine, batch_id)  # another runner stages it: never fence a live attempt
        if batch.status in (BatchStatus.STAGED, BatchStatus.COMMITTED):
            return batch
    staging = table.name
    log.info("batch %d attempt %d: reading %d offsets from %d ranges into ledger_staging.%s",
             batch_id, attempt, batch.span, len(batch.ranges), staging)
    job = StagingJob(
        batch_id=batch_id, attempt=attempt, ranges=batch.ranges,
        kafka=consumer_config(bootstrap_servers, dict(spec.kafka_options)), stall_timeout_s=stall_timeout_s,
        parsing=Parsing.of(spec), table=table,
        output=shape.output_order if spec.query is not None else (), aggregate=shape.groups,
        inputs=transform.query_inputs(spark, spec) if spec.query is not None else (),
    )
    try:
        with AttemptLease(engine, batch_id, attempt):
            if turns is not None and plain(spec):
                stage_in_turn(spark, engine, job, turns)
            else:
                stage_batch(spark, engine, spec, job)
    except Exception as exc:
        reason = spark_error_reason(exc)
        with engine.begin() as conn:
            owned = mark_failed(conn, batch_id, attempt, reason)
        if not owned or FENCED in reason:
            drop_staging_quietly(engine, [staging])  # a newer attempt owns the batch
            raise FencedError(f"batch {batch_id} attempt {attempt}: {reason}") from None
        if OFFSETS_LOST in reason:
            raise DataLossError(f"batch {batch_id}: its ranges are no longer in Kafka ({reason}); nothing was "
                                f"committed. After checking, record the loss with `ledgerbatch acknowledge-loss "
                                f"{spec.name} --by NAME`") from None
        raise BatchFailedError(f"batch {batch_id} attempt {attempt} failed: {reason}") from None

    with engine.connect() as conn:
        batch = get_batch(conn, batch_id)
    if batch.status != BatchStatus.STAGED or batch.attempt != attempt:
        drop_staging_quietly(engine, [staging])
        raise FencedError(f"batch {batch_id}: attempt {attempt} was overtaken by attempt {batch.attempt}")
    counts = Counts(batch.records_read, batch.rows_written, batch.rows_quarantined)
    try:
        check_error_budget(counts, spec.error_policy, spec.max_error_ratio, spec.min_bad)
    except ReconcileError as exc:
        with engine.begin() as conn:
            mark_failed(conn, batch_id, attempt, str(exc))
        raise BatchFailedError(
            f"batch {batch_id} failed, nothing committed: {exc}. The bad records are in "
            f"ledger_staging.{StagingTables(staging).bad}. "
            + ("The next run plans these offsets again with the records that arrived since" if OVER_BUDGET in str(exc)
               else "Fix the data or the spec's errors section and run again")
        ) from None
    log.info("batch %d staged: %d records read, %d rows, %d deleted, %d skipped, %d filtered, %d bad%s (%.1fs)",
             batch_id, counts.records_read, counts.rows_written, batch.rows_deleted, batch.records_skipped,
             batch.records_filtered, counts.rows_quarantined,
             f", {batch.groups_written} groups" if batch.groups_written is not None else "", time.monotonic() - started)
    return batch


def spark_error_reason(exc: Exception) -> str:
    """The Python error at the root of a Spark failure, in one line."""
    message = str(exc)
    tracebacks = _TRACEBACK.findall(message)
    if tracebacks:
        lines = [line.strip() for line in tracebacks[-1].splitlines() if line.strip()]
        if lines:
            return lines[-1]
    return message.strip().splitlines()[0] if message.strip() else type(exc).__name__
