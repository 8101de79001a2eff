"""Staging, driver side: start an attempt's staging tasks (tasks.py) and record what they staged.

Nothing is collected to the driver but counts: executors read Kafka and COPY into PostgreSQL themselves.
Every path is one Spark job of Arrow-in, Arrow-out Python tasks whose counts the driver records once all
of them succeeded, so a failed or retried task never leaves a count behind.
"""
from __future__ import annotations

import functools
import logging

from sqlalchemy.engine import Engine

from ledgerbatch.formats.parse import staged_struct
from ledgerbatch.ledger.batches import mark_staged, staged_reads
from ledgerbatch.model.reconcile import query_counts
from ledgerbatch.spark.session import is_connect
from ledgerbatch.spec.pipeline import PipelineSpec
from ledgerbatch.stage import stamps
from ledgerbatch.stage.job import COUNTS, OUTPUT_COUNTS, StagingJob
from ledgerbatch.stage.tasks import parse_good_rows, parse_ranges, stage_output, stage_parsed, stage_ranges
from ledgerbatch.stage.transform import run_query, view_struct
from ledgerbatch.stage.turns import Turns

log = logging.getLogger(__name__)


def stage_batch(spark, engine: Engine, spec: PipelineSpec, job: StagingJob) -> None:
    """Stage every range of the job; the batch is `staged` with its counts when this returns."""
    if spec.query is not None:
        _stage_query(spark, engine, spec, job)
    elif spec.transform:
        _stage_dataframe(spark, engine, spec, job)
    else:
        _stage_direct(spark, engine, job)


def plain(spec: PipelineSpec) -> bool:
    """Whether the pipeline's batches are read, parsed and copied with no Spark plan of their own (no transform,
    no query): those a service stages in turns."""
    return spec.query is None and not spec.transform


def stage_in_turn(spark, engine: Engine, job: StagingJob, turns: Turns) -> None:
    """Stage a plain pipeline's job in a turn with other pipelines' (turns.py), as stage_batch would alone."""
    _mark_ranges(engine, job, turns.stage(spark, job, default_parallelism(spark)))


def _stage_direct(spark, engine: Engine, job: StagingJob) -> None:
    """Spark tasks read, parse and COPY whole ranges; only the counts come back. Two tasks per core
    keep every core busy while sparing each range a task's start-up (Kafka and PostgreSQL connections)."""
    tasks = min(len(job.ranges), 2 * default_parallelism(spark))
    task = functools.partial(stage_ranges, job=job)
    _mark_ranges(engine, job, _over_ranges(spark, job, tasks).mapInArrow(task, COUNTS).collect())


def _stage_dataframe(spark, engine: Engine, spec: PipelineSpec, job: StagingJob) -> None:
    """The transform is per-column Spark SQL: parsed rows go through a DataFrame and back to Python tasks
    that stage them, one range per task (a range is staged in one transaction)."""
    plan = transform_plan(_over_ranges(spark, job, len(job.ranges)), spec, functools.partial(parse_ranges, job=job),
                          functools.partial(stage_parsed, job=job))
    _mark_ranges(engine, job, plan.collect())


def transform_plan(ranges, spec: PipelineSpec, parse, stage, counts=COUNTS):
    """Ranges (one row each) -> their parsed rows -> the per-column transform -> the tasks that stage them
    (which give `counts` rows)."""
    parsed = ranges.mapInArrow(parse, staged_struct(spec.columns, spec.metadata, spec.changes))
    return apply_transform(parsed, spec).mapInArrow(stage, counts)


def _mark_ranges(engine: Engine, job: StagingJob, rows: list) -> None:
    """Record the counts the tasks returned (COUNTS rows, one per staged range), fenced by the attempt; keep
    the records' timestamps for the commit's freshness metric (stamps.py)."""
    counts = {(r.topic, r.partition): (r.rows, r.bad, r.deleted, r.skipped) for r in rows if r.rows}
    with engine.begin() as conn:
        mark_staged(conn, job.batch_id, job.attempt, job.table.name, job.ranges, counts)
    stamps.kept.keep(job.batch_id, job.attempt, [r.stamps for r in rows])


def _stage_query(spark, engine: Engine, spec: PipelineSpec, job: StagingJob) -> None:
    """The transform is a query over `batch`: each range's bad records and counts are staged as it is
    parsed, the query's output by Python tasks after it; then the attempt's reads and output are recorded."""
    tasks = min(len(job.ranges), 2 * default_parallelism(spark))
    parse, stage = functools.partial(parse_good_rows, job=job), functools.partial(stage_output, job=job)
    output = query_plan(_over_ranges(spark, job, tasks), spec, job.inputs, job.output, parse, stage).collect()
    with engine.begin() as conn:
        reads = staged_reads(conn, job.batch_id, job.attempt)
        unread = [str(r) for r in job.ranges if r.topic_partition not in reads]
        if unread:
            raise RuntimeError(f"the query did not read every range to its end ({', '.join(unread)}): "
                               f"a LIMIT cannot be part of a pipeline's transform")
        filtered, groups = query_counts(reads, sum(r.rows for r in output), job.aggregate)
        mark_staged(conn, job.batch_id, job.attempt, job.table.name, job.ranges, reads,
                    filtered=filtered, groups=groups)


def query_plan(ranges, spec: PipelineSpec, inputs: tuple[str, ...], output: tuple[str, ...], parse, stage):
    """Ranges (one row each) -> the good rows' `inputs` -> the query -> its `output` -> the tasks that COPY it."""
    parsed = ranges.mapInArrow(parse, view_struct(spec, inputs))
    return run_query(ranges.sparkSession, parsed, spec).select(*output).mapInArrow(stage, OUTPUT_COUNTS)


def _over_ranges(spark, job: StagingJob, tasks: int):
    """One row per range of the job, the range's index, in `tasks` slices: the tasks read their ranges."""
    return spark.range(0, len(job.ranges), 1, tasks)


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
