"""A follower's warm-up, executor side (stage/warm_up.py starts it): what its Spark tasks run. Like
tasks.py, it imports without sqlalchemy, which executors do not have."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from ledgerbatch.model.ranges import OffsetRange
from ledgerbatch.stage.job import OUTPUT_COUNTS, Parsing

STALL_TIMEOUT_S = 10.0  # the sample is already in the log: a read that stalls this long gives up


@dataclass(frozen=True)
class Sample:
    """What the warm-up's tasks read (pickled to executors): the ranges, how to read and parse them (the
    fields tasks.parse_ranges reads of a StagingJob), and for a query the columns of `batch` it reads (its
    input is good records only)."""
    ranges: tuple[OffsetRange, ...]
    kafka: dict
    parsing: Parsing
    inputs: tuple[str, ...] | None = None
    stall_timeout_s: float = STALL_TIMEOUT_S


def warm_worker(batches, parsing: Parsing):
    """A warm-up task: import the staging code and parse one throwaway value, which pays once for what the
    parser's first chunk would (Arrow's readers and kernels)."""
    from ledgerbatch.source.reader import Records
    from ledgerbatch.stage import tasks  # noqa: F401  (importing it is the point)

    parsing.parser().parse("warm-up", 0, Records([0], [None], [b"{}"], [None], [None]))
    yield from batches


def sample_rows(ids: Iterator, sample: Sample) -> Iterator:
    """mapInArrow body over the sample's range indexes: this task's ranges read and parsed as a batch's are
    (tasks.parse_ranges), bad records left out for a query."""
    import pyarrow.compute as pc

    from ledgerbatch.stage.tasks import parse_ranges

    for batch in parse_ranges(ids, sample):
        if sample.inputs is not None:
            batch = batch.filter(pc.is_null(batch.column("_error"))).select(list(sample.inputs))
        yield batch


def encode_rows(ids: Iterator, sample: Sample, columns: tuple[str, ...], binary_types: tuple[str, ...]) -> Iterator:
    """A direct pipeline's warm-up task: its ranges read and parsed as a batch's are, and the good rows made
    into the COPY's data as a batch's are (`columns` and `binary_types` as its StagingTable has them), which
    is then dropped: each worker pays once for its first ranges' consumers, allocations and kernels."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    from ledgerbatch.formats.schema import COORDINATE_NAMES
    from ledgerbatch.stage.csv_copy import CopyStream, split_bad, staged_arrays
    from ledgerbatch.stage.tasks import parse_ranges

    rows = 0
    for batch in parse_ranges(ids, sample):
        good = split_bad(batch)[0]
        rows += good.num_rows
        stream = CopyStream.of(iter([staged_arrays(good, columns + COORDINATE_NAMES, 0)]), binary_types)
        while stream.read():
            pass
    yield pa.RecordBatch.from_pylist([{"rows": rows}], schema=to_arrow_schema(OUTPUT_COUNTS))


def count_rows(batches) -> Iterator:
    """A warm-up task's end of the plan: it takes the output in, as a staging task would, and drops it."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    rows = sum(b.num_rows for b in batches)
    yield pa.RecordBatch.from_pylist([{"rows": rows}], schema=to_arrow_schema(OUTPUT_COUNTS))
