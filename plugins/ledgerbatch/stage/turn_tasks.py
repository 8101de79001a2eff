"""Executor side of a turn (stage/turns.py): one Spark task stages its share of many pipelines' ranges.

A task's items are (job, range) pairs; it stages them job by job as `stage_ranges` stages one job's. A job's
failure (its poison record, its offsets gone, its attempt fenced) becomes that job's error row, not the task's
failure, so one pipeline's trouble fails its own batch alone and the turn's other jobs are staged as ever."""
from __future__ import annotations

import traceback
from typing import Iterator

from pyspark.sql.types import IntegerType, StringType, StructField, StructType

from ledgerbatch.stage.job import COUNTS, StagingJob
from ledgerbatch.stage.tasks import stage_ranges

TURN_COUNTS = StructType([*COUNTS.fields, StructField("job", IntegerType(), False),
                          StructField("error", StringType(), True)])


def stage_turn(ids: Iterator, jobs: tuple[StagingJob, ...], items: tuple[tuple[int, int], ...]) -> Iterator:
    """mapInArrow body over spark.range(len(items)): each job's ranges of this task, its counts (or its error)
    as TURN_COUNTS rows. A job's rows are held until all its ranges are staged: a failed job gives its error
    only."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    mine: dict[int, list[int]] = {}
    for id_batch in ids:
        for i in id_batch.column(0).to_pylist():
            job, rng = items[i]
            mine.setdefault(job, []).append(rng)
    schema = to_arrow_schema(TURN_COUNTS)
    for j, ranges in mine.items():
        try:
            rows = [row for counts in stage_ranges(iter([pa.record_batch([pa.array(ranges, pa.int64())], ["id"])]),
                                                   jobs[j]) for row in counts.to_pylist()]
        except Exception as exc:  # noqa: BLE001 - the job's failure is its row: the driver raises it for that job
            rows = [{"topic": "", "partition": -1, "rows": 0, "bad": 0, "deleted": 0, "skipped": 0, "stamps": None,
                     "error": traceback.format_exception_only(type(exc), exc)[-1].strip()}]
        yield pa.RecordBatch.from_pylist([{**row, "job": j, "error": row.get("error")} for row in rows], schema=schema)
