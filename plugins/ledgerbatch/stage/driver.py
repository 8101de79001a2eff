"""Staging, driver side: start an attempt's staging tasks (tasks.py, sink.py) and record what they staged.

Nothing is collected to the driver but counts: executors read Kafka and COPY into PostgreSQL themselves.
"""
from __future__ import annotations

import functools

from sqlalchemy.engine import Engine

from ledgerbatch.formats.parse import parse_batches, staged_struct
from ledgerbatch.ledger.batches import mark_staged
from ledgerbatch.source.reader import KAFKA_RANGES
from ledgerbatch.spark.session import is_connect
from ledgerbatch.spec.pipeline import PipelineSpec
from ledgerbatch.stage.job import COUNTS, StagingJob
from ledgerbatch.stage.sink import STAGING_SINK
from ledgerbatch.stage.tasks import stage_bad_records, stage_ranges
from ledgerbatch.stage.transform import run_query


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
    task = functools.partial(stage_ranges, job=job)
    rows = spark.range(0, len(job.ranges), 1, tasks).mapInArrow(task, COUNTS).collect()
    counts = {(r.topic, r.partition): (r.rows, r.bad, r.deleted, r.skipped) for r in rows if r.rows}
    with engine.begin() as conn:
        mark_staged(conn, job.batch_id, job.attempt, job.table.name, job.ranges, counts)


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
    stage_bad = functools.partial(stage_bad_records, job=job)
    good = _read(spark, job).mapInArrow(stage_bad, staged_struct(job.columns, job.metadata))
    _write(run_query(spark, good, spec).select(*job.output), job, db_url)


def _read(spark, job: StagingJob):
    """The job's ranges through the range reader (source/reader.py), one input partition per range."""
    import json

    return (
        spark.read.format(KAFKA_RANGES)
        .option("ranges", json.dumps([r.to_dict() for r in job.ranges]))
        .option("kafka", json.dumps(job.kafka))
        .option("stall_timeout_s", str(job.stall_timeout_s))
        .load()
    )


def _write(df, job: StagingJob, db_url: str) -> None:
    df.write.format(STAGING_SINK).mode("append").option("job", job.encode()).option("db_url", db_url).save()


def apply_transform(df, spec: PipelineSpec):
    """The spec's per-column Spark SQL expressions, on good rows only, cast back to the staged type
    (nested and binary columns are staged as text)."""
    from pyspark.sql import functions as F

    types = {c.name: "STRING" if c.staged_as_text else c.spark_ddl for c in spec.columns}
    for column, expression in spec.transform:
        df = df.withColumn(column, F.when(F.col("_error").isNull(), F.expr(expression)).cast(types[column]))
    return df


def default_parallelism(spark) -> int:
    """The cluster's default parallelism (its cores): SparkContext.defaultParallelism on a classic session.
    Spark Connect has no SparkContext: `spark.default.parallelism` where the server sets it (`ledgerbatch
    spark-server` does for local masters), else the number of splits Spark gives a `range` without a
    partition count (which is the default parallelism), found by one small JVM-only query, cached by this
    process only (a cluster's executors may still have been joining when a kept session was first used)."""
    if not is_connect(spark):
        return spark.sparkContext.defaultParallelism
    key = spark.session_id
    if key not in _PARALLELISM:
        configured = spark.conf.get("spark.default.parallelism", None)
        if configured:
            _PARALLELISM[key] = int(configured)
        else:
            from pyspark.sql import functions as F

            ids = spark.range(0, 1 << 16).select(F.spark_partition_id().alias("p"))
            _PARALLELISM[key] = ids.agg(F.max("p")).first()[0] + 1
    return _PARALLELISM[key]


_PARALLELISM: dict[str, int] = {}


def warm_up(spark) -> float:
    """Start the executors' Python workers with the staging code imported, so that the first batch of
    a long-lived driver (`run --follow`) is as quick as the ones after it. Returns the seconds taken."""
    import time

    from pyspark.sql.types import LongType, StructField, StructType

    started = time.monotonic()
    tasks = 2 * default_parallelism(spark)
    spark.range(0, tasks, 1, tasks).mapInArrow(_import_staging, StructType([StructField("id", LongType())])).collect()
    return time.monotonic() - started


def _import_staging(batches):
    from ledgerbatch.formats import parse  # noqa: F401  (the imports are the point)
    from ledgerbatch.source import reader  # noqa: F401
    from ledgerbatch.stage import tasks  # noqa: F401

    yield from batches
