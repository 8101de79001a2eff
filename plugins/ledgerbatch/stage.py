"""Staging, driver side: start an attempt's staging tasks (stage_tasks.py) and record what they staged.

Nothing is collected to the driver but counts: executors read Kafka and COPY into PostgreSQL themselves.
"""
from __future__ import annotations

import functools

from sqlalchemy.engine import Engine

from . import ledger, source, stage_tasks
from .parse import parse_batches, staged_struct
from .spec import PipelineSpec
from .sparksession import default_parallelism
from .stage_tasks import StagingJob
from .transform import run_query


def stage_batch(spark, engine: Engine, spec: PipelineSpec, job: StagingJob, db_url: str) -> None:
    """Stage every range of the job; the batch is `staged` with its counts when this returns."""
    if spec.query is not None:
        _stage_query(spark, spec, job, db_url)
    elif spec.transform:
        _stage_dataframe(spark, spec, job, db_url)
    else:
        _stage_direct(spark, engine, job)


def _stage_direct(spark, engine: Engine, job: StagingJob) -> None:
    """Spark tasks read, parse and COPY whole ranges; only the counts come back. Two tasks per core
    keep every core busy while sparing each range a task's start-up (Kafka and PostgreSQL connections)."""
    tasks = min(len(job.ranges), 2 * default_parallelism(spark))
    task = functools.partial(stage_tasks.stage_ranges, job=job)
    rows = spark.range(0, len(job.ranges), 1, tasks).mapInArrow(task, stage_tasks.COUNTS).collect()
    counts = {(r.topic, r.partition): (r.rows, r.bad, r.deleted, r.skipped) for r in rows if r.rows}
    with engine.begin() as conn:
        ledger.mark_staged(conn, job.batch_id, job.attempt, job.table.name, job.ranges, counts)


def _stage_dataframe(spark, spec: PipelineSpec, job: StagingJob, db_url: str) -> None:
    """The transform is per-column Spark SQL: rows go through a DataFrame from the range reader to the
    staging sink, whose commit records the counts."""
    parse = functools.partial(parse_batches, columns=job.columns, required=job.required, fmt=job.fmt,
                              options=job.format_options, metadata=job.metadata, changes=job.changes)
    parsed = _read(spark, job).mapInArrow(parse, staged_struct(job.columns, job.metadata, job.changes))
    _write(apply_transform(parsed, spec), job, db_url)


def _stage_query(spark, spec: PipelineSpec, job: StagingJob, db_url: str) -> None:
    """The transform is a query over `batch`: each range's bad records and counts are staged as it is
    parsed, the query's output goes to the staging sink, whose commit records the counts."""
    stage_bad = functools.partial(stage_tasks.stage_bad_records, job=job)
    good = _read(spark, job).mapInArrow(stage_bad, staged_struct(job.columns, job.metadata))
    _write(run_query(spark, good, spec).select(*job.output), job, db_url)


def _read(spark, job: StagingJob):
    """The job's ranges through the range reader (source.py), one input partition per range."""
    import json

    return (
        spark.read.format(source.FORMAT)
        .option("ranges", json.dumps([r.to_dict() for r in job.ranges]))
        .option("kafka", json.dumps(job.kafka))
        .option("stall_timeout_s", str(job.stall_timeout_s))
        .load()
    )


def _write(df, job: StagingJob, db_url: str) -> None:
    df.write.format(stage_tasks.FORMAT).mode("append").option("job", job.encode()).option("db_url", db_url).save()


def apply_transform(df, spec: PipelineSpec):
    """The spec's per-column Spark SQL expressions, on good rows only, cast back to the staged type
    (nested and binary columns are staged as text)."""
    from pyspark.sql import functions as F

    types = {c.name: "STRING" if c.staged_as_text else c.spark_ddl for c in spec.columns}
    for column, expression in spec.transform:
        df = df.withColumn(column, F.when(F.col("_error").isNull(), F.expr(expression)).cast(types[column]))
    return df
