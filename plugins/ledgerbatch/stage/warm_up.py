"""A long-lived driver's warm-up (`run --follow`): make its first batch as quick as the ones after it.

What a first batch paid more than a later one is paid once per process: each Python worker's start, its
parser's first chunk and its first ranges (consumers, memory the worker grows into), Spark generating and
compiling a transform's code (Janino), and the JIT compiling the JVM's hot paths of that plan (Arrow in,
the query, Arrow out), which only records make hot. So the warm-up parses one throwaway value in every
worker, then runs what the staging tasks run over a sample of the topics' newest records, and drops its
output: a transform's plan, the one a batch runs; without a transform, the reading, parsing and making
of the COPY's data (sent nowhere). It writes nothing: reading a record twice changes nothing in Kafka,
and the batches read their ranges as ever.
"""
from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass

from ledgerbatch.model.ranges import newest_ranges
from ledgerbatch.source.kafka import consumer_config, watermarks
from ledgerbatch.spec.pipeline import PipelineSpec
from ledgerbatch.stage.driver import default_parallelism, query_plan, transform_plan
from ledgerbatch.stage.job import OUTPUT_COUNTS, Parsing
from ledgerbatch.stage.transform import batch_shape, query_inputs
from ledgerbatch.stage.warm_tasks import Sample, count_rows, encode_rows, sample_rows, warm_worker

log = logging.getLogger(__name__)

# Newest records a warm-up task runs through the staging tasks' work. A first filter batch of 1M orders
# took 1.41x the floor while the warm-up ran the plan over no records, 1.06-1.09x over 50,000 records a
# task; JSON append 0.98x/1.03x without its warm-up over records, 0.96x/0.95x with it (docs/performance.md).
RECORDS_PER_TASK = 50_000
RANGES_PER_TASK = 8  # of as many partitions: a topic of thousands would open a consumer for each


@dataclass(frozen=True)
class WarmUp:
    seconds: float
    offsets: int = 0  # the sample the staging tasks' work ran over (offsets of the newest records)
    rows_out: int = 0  # the rows it gave, dropped


def warm_up(spark, spec: PipelineSpec, bootstrap_servers: str) -> WarmUp:
    """Start the executors' Python workers, each with the staging code imported and the spec's parser run
    once; then run the staging tasks' work over RECORDS_PER_TASK of the newest records a task. A warm-up
    that fails is logged and left to the first batch, which reports what is wrong."""
    from pyspark.sql.types import LongType, StructField, StructType

    started = time.monotonic()
    tasks = 2 * default_parallelism(spark)
    offsets = rows_out = 0
    try:
        slots = spark.range(0, tasks, 1, tasks)  # one row per warm-up task, as many tasks as a batch's
        parsing = Parsing.of(spec)
        ids = StructType([StructField("id", LongType())])
        slots.mapInArrow(functools.partial(warm_worker, parsing=parsing), ids).collect()
        offsets, rows_out = _run_plan(spark, spec, parsing, bootstrap_servers, tasks)
        log.info("%s: warm-up: the staging tasks' %s ran over the newest %d offsets, %d rows out (dropped)",
                 spec.name, "plan" if spec.query is not None or spec.transform else "reading, parsing and COPY data",
                 offsets, rows_out)
    except Exception as exc:  # only a head start: the first batch reports what is wrong
        log.warning("%s: the warm-up did not finish (%s); the first batch will tell", spec.name,
                    str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    return WarmUp(time.monotonic() - started, offsets, rows_out)


def _run_plan(spark, spec: PipelineSpec, parsing: Parsing, bootstrap_servers: str, tasks: int) -> tuple[int, int]:
    """Run the staging tasks' work (a transform's plan, else reading, parsing and the COPY's data), as a batch
    of `tasks` staging tasks would, over a sample of the newest records; returns the offsets sampled and
    the rows that came out."""
    options = dict(spec.kafka_options)
    newest = newest_ranges(watermarks(bootstrap_servers, spec.topics, options), RECORDS_PER_TASK * tasks,
                           RANGES_PER_TASK * tasks)
    sample = Sample(newest, consumer_config(bootstrap_servers, options), parsing,
                    query_inputs(spark, spec) if spec.query is not None else None)
    ranges = spark.range(0, len(newest), 1, tasks)  # none when the topics are empty: the plan still compiles
    read = functools.partial(sample_rows, sample=sample)
    shape = batch_shape(spark, spec)
    if spec.query is not None:
        counts = query_plan(ranges, spec, sample.inputs, shape.output_order, read, count_rows).collect()
    elif spec.transform:
        counts = transform_plan(ranges, spec, read, count_rows, OUTPUT_COUNTS).collect()
    else:
        encode = functools.partial(encode_rows, sample=sample, columns=shape.staged_names,
                                   binary_types=shape.binary_types)
        counts = ranges.mapInArrow(encode, OUTPUT_COUNTS).collect()
    return sum(r.span for r in newest), sum(c.rows for c in counts)
