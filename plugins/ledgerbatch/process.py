"""Processing one batch on Spark: read its ranges, parse, write the attempt's staging table.

Nothing is collected to the driver: executors read Kafka and COPY into PostgreSQL themselves.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import logging
import re
import time

from sqlalchemy.engine import Engine

from . import ledger, source, stage, tables
from .config import libpq_dsn
from .errors import BatchFailedError, DataLossError, FencedError, ReconcileError
from .kafka import consumer_config
from .ledger import Batch
from .parse import parse_batches, staged_struct
from .reconcile import Counts, check_error_budget
from .spec import PipelineSpec
from .sqlfiles import query

log = logging.getLogger(__name__)
# A Python worker's traceback inside a Spark error, up to Spark's own SQLSTATE or JVM stack.
_TRACEBACK = re.compile(r"Traceback \(most recent call last\):\n(.*?)(?=\n\s*SQLSTATE|\n\tat |\Z)", re.S)


def process_batch(spark, engine: Engine, spec: PipelineSpec, batch_id: int, db_url: str, bootstrap_servers: str,
                  stall_timeout_s: float = 60.0) -> Batch:
    """Stage batch `batch_id` under a new attempt; returns the staged batch. Raises if it cannot."""
    started = time.monotonic()
    with engine.connect() as conn:
        batch = ledger.get_batch(conn, batch_id)
    if batch.status == "staged":  # e.g. a task retried after staging: commit what is there, never re-read
        log.info("batch %d is already staged by attempt %d: nothing to process", batch_id, batch.attempt)
        return batch
    with engine.begin() as conn:
        attempt = ledger.begin_attempt(conn, batch_id)
        batch = ledger.get_batch(conn, batch_id)
        staging = tables.staging_name(batch_id, attempt)
        tables.create_staging(conn, spec, staging, batch_id)
    log.info("batch %d attempt %d: reading %d offsets from %d ranges into ledger_staging.%s",
             batch_id, attempt, batch.span, len(batch.ranges), staging)
    ranges = [r.to_dict() for r in batch.ranges]
    kafka = consumer_config(bootstrap_servers, dict(spec.kafka_options))
    target = stage.Target(libpq_dsn(db_url), staging, tables.staging_sql(spec, staging),
                          tuple(c.name for c in spec.columns), batch_id)
    ledger_sql = {"mark_staged": query("mark_staged"), "set_range_count": query("set_range_count")}
    try:
        if spec.transform:
            _stage_dataframe(spark, spec, ranges, kafka, stall_timeout_s, target, db_url, ledger_sql, attempt)
        else:
            _stage_direct(spark, engine, spec, ranges, kafka, stall_timeout_s, target, ledger_sql, attempt)
    except Exception as exc:
        reason = spark_error_reason(exc)
        with engine.begin() as conn:
            owned = ledger.mark_failed(conn, batch_id, attempt, reason)
        if not owned or "no longer owns the batch" in reason:
            tables.drop_staging_quietly(engine, [staging])  # a newer attempt owns the batch
            raise FencedError(f"batch {batch_id} attempt {attempt}: {reason}") from None
        if "Offset out of range" in reason:
            raise DataLossError(f"batch {batch_id}: its ranges are no longer in Kafka ({reason}); nothing was "
                                f"committed. After checking, record the loss with `ledgerbatch acknowledge-loss "
                                f"{spec.name} --by NAME`") from None
        raise BatchFailedError(f"batch {batch_id} attempt {attempt} failed: {reason}") from None

    with engine.connect() as conn:
        batch = ledger.get_batch(conn, batch_id)
    if batch.status != "staged" or batch.attempt != attempt:
        tables.drop_staging_quietly(engine, [staging])
        raise FencedError(f"batch {batch_id}: attempt {attempt} was overtaken by attempt {batch.attempt}")
    counts = Counts(batch.records_read, batch.rows_written, batch.rows_quarantined)
    try:
        check_error_budget(counts, spec.error_policy, spec.max_error_ratio)
    except ReconcileError as exc:
        with engine.begin() as conn:
            ledger.mark_failed(conn, batch_id, attempt, str(exc))
        raise BatchFailedError(
            f"batch {batch_id} failed, nothing committed: {exc}. The bad records are in "
            f"ledger_staging.{tables.bad_name(staging)}; fix the data or the spec's errors section "
            f"and run again"
        ) from None
    log.info("batch %d staged: %d records read, %d rows, %d bad (%.1fs)", batch_id, counts.records_read,
             counts.rows_written, counts.rows_quarantined, time.monotonic() - started)
    return batch


def _stage_direct(spark, engine: Engine, spec: PipelineSpec, ranges: list[dict], kafka: dict, stall_timeout_s: float,
                  target: stage.Target, ledger_sql: dict, attempt: int) -> None:
    """Spark tasks read, parse and COPY whole ranges; only the counts come back. Two tasks per core
    keep every core busy while sparing each range a task's start-up (Kafka and PostgreSQL connections)."""
    task = functools.partial(stage.stage_ranges, ranges=ranges, kafka=kafka, stall_timeout_s=stall_timeout_s,
                             columns=spec.columns, required=spec.key, target=target)
    tasks = min(len(ranges), 2 * spark.sparkContext.defaultParallelism)
    rows = spark.range(0, len(ranges), 1, tasks).mapInArrow(task, stage.COUNTS).collect()
    counts = {(r.topic, r.partition): (r.rows, r.bad) for r in rows if r.rows}
    with engine.begin() as conn:
        stage.mark_staged(conn, ledger_sql, target.batch_id, attempt, target.staging, ranges, counts)


def _stage_dataframe(spark, spec: PipelineSpec, ranges: list[dict], kafka: dict, stall_timeout_s: float,
                     target: stage.Target, db_url: str, ledger_sql: dict, attempt: int) -> None:
    """The transform is Spark SQL: rows go through a DataFrame from the range reader to the staging sink."""
    raw = (
        spark.read.format(source.FORMAT)
        .option("ranges", json.dumps(ranges))
        .option("kafka", json.dumps(kafka))
        .option("stall_timeout_s", str(stall_timeout_s))
        .load()
    )
    parsed = raw.mapInArrow(functools.partial(parse_batches, columns=spec.columns, required=spec.key),
                            staged_struct(spec.columns))
    (
        apply_transform(parsed, spec).write.format(stage.FORMAT).mode("append")
        .option("target", json.dumps(dataclasses.asdict(target)))
        .option("db_url", db_url)
        .option("ledger_sql", json.dumps(ledger_sql))
        .option("attempt", str(attempt))
        .option("ranges", json.dumps(ranges))
        .save()
    )


def apply_transform(df, spec: PipelineSpec):
    """The spec's per-column Spark SQL expressions, on good rows only, cast back to the column type."""
    from pyspark.sql import functions as F

    types = {c.name: c.spark_ddl for c in spec.columns}
    for column, expression in spec.transform:
        df = df.withColumn(column, F.when(F.col("_error").isNull(), F.expr(expression)).cast(types[column]))
    return df


def spark_error_reason(exc: Exception) -> str:
    """The Python error at the root of a Spark failure, in one line."""
    message = str(exc)
    tracebacks = _TRACEBACK.findall(message)
    if tracebacks:
        lines = [line.strip() for line in tracebacks[-1].splitlines() if line.strip()]
        if lines:
            return lines[-1]
    return message.strip().splitlines()[0] if message.strip() else type(exc).__name__
