"""Staging, executor side: what Spark tasks run to put a batch's parsed rows into its staging tables.

Good rows go to `bN_aM` in the target's shape (an append commit attaches that table as the batch's
partition), bad records to `bN_aM_bad`. Each range is staged in one transaction that first deletes
what an earlier try of it left, so a retried task never duplicates.

Every range is read and parsed inside a Python task, so raw values never cross into the JVM. Without a
transform, `stage_ranges` also stages them there. A per-column transform (Spark SQL) gets the parsed rows
(`parse_ranges`) and `stage_parsed` stages its output. A query transform (transform.py) may drop,
multiply or group records, so its pipelines stage each range's bad records and read counts as they are
parsed (`parse_good_rows`) and the query's output after it (`stage_output`). The COPYs themselves are
csv_copy.py's. The driver side (driver.py) starts them and records the counts.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

from ledgerbatch.stage.csv_copy import copy_range, copy_stream, stage_bad, staged_arrays
from ledgerbatch.stage.job import COUNTS, OUTPUT_COUNTS, StagingJob, StagingTable
from ledgerbatch.stage.stamps import Stamps


def stage_ranges(ids: Iterator, job: StagingJob) -> Iterator:
    """mapInArrow body over spark.range(len(job.ranges)): read, parse and stage the ranges of this task."""
    parser = job.parsing.parser()
    with staging_connection(job.table) as conn:
        for rng, records in _task_ranges(ids, job):
            yield stage_range(rng, records, parser, job.table, conn)


def stage_range(rng, records: Iterator, parser, table: StagingTable, conn):
    """Parse and COPY one range's chunks of records in one transaction on `conn` (copy_range); its COUNTS row,
    with its records by timestamp."""
    stamps = Stamps()
    counts = copy_range(_parsed(rng, stamps.seen(records), parser), table, conn)
    return _counts(counts or (rng.topic, rng.partition, 0, 0, 0, 0), stamps.text())


def parse_ranges(ids: Iterator, job: StagingJob) -> Iterator:
    """mapInArrow body of a per-column-transform pipeline over spark.range(len(job.ranges)) in one slice per
    range: read and parse the task's range, every row on to the transform, then to `stage_parsed`, which
    stages the bad ones too. Raw values never cross into the JVM. A warm-up's sample (warm_tasks.Sample,
    with the same ranges, kafka, stall_timeout_s and parsing) is read through it too."""
    parser = job.parsing.parser()
    for rng, records in _task_ranges(ids, job):
        yield from _parsed(rng, records, parser)


def parse_good_rows(ids: Iterator, job: StagingJob) -> Iterator:
    """mapInArrow body of a query pipeline over spark.range(len(job.ranges)): read and parse the task's
    ranges, COPY each range's bad records and record what was read (ledger/batches.py: staged_reads) in one
    transaction per range, and pass the good rows' columns the query reads (job.inputs) on to it. A range
    that is not read to its end (a LIMIT in the query) records nothing, and the batch fails."""
    parser = job.parsing.parser()
    sql = job.table.statements
    with staging_connection(job.table) as conn:
        for rng, chunks in _task_ranges(ids, job):
            where = {"topic": rng.topic, "partition": rng.partition}
            records = bad = 0
            with conn, conn.cursor() as cur:
                cur.execute(sql.lock, {"lock": f"{job.table.name}|{rng.topic}|{rng.partition}"})
                cur.execute(sql.delete_bad, where)
                for batch in _parsed(rng, chunks, parser):
                    records += batch.num_rows
                    batch, nbad = stage_bad(cur, sql, batch)
                    bad += nbad
                    if batch.num_rows:
                        yield batch.select(job.inputs)
                cur.execute(sql.record_read, {**where, "batch_id": job.batch_id, "attempt": job.attempt,
                                              "records": records, "bad": bad})


def stage_parsed(batches: Iterator, job: StagingJob) -> Iterator:
    """mapInArrow body after a per-column transform: stage the task's ONE range (its parsed rows, bad ones
    apart) as `stage_ranges` does, and give its counts."""
    with staging_connection(job.table) as conn:
        counts = copy_range(batches, job.table, conn)
    if counts is not None:
        yield _counts(counts)


def _counts(counts: tuple, stamps: str | None = None):
    """One range's counts (and its records by timestamp, where they were counted) as the COUNTS row its task
    returns."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    return pa.RecordBatch.from_pylist([dict(zip(COUNTS.names, (*counts, stamps)))], schema=to_arrow_schema(COUNTS))


def stage_output(batches: Iterator, job: StagingJob) -> Iterator:
    """mapInArrow body after a query: stage the task's share of the output (copy_output), give its rows."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    yield pa.RecordBatch.from_pylist([{"rows": copy_output(batches, job)}], schema=to_arrow_schema(OUTPUT_COUNTS))


def _task_ranges(ids: Iterator, job: StagingJob) -> Iterator:
    """This task's ranges (their indexes in `ids`), each with its records, read from Kafka in chunks."""
    from ledgerbatch.source.reader import read_ranges

    ranges = [job.ranges[i] for id_batch in ids for i in id_batch.column(0).to_pylist()]
    return read_ranges(ranges, job.kafka, job.stall_timeout_s, bool(job.parsing.metadata))


def _parsed(rng, records: Iterator, parser) -> Iterator:
    """The parsed Arrow batches of one range's chunks of records."""
    for chunk in records:
        yield parser.parse(rng.topic, rng.partition, chunk)


@contextlib.contextmanager
def staging_connection(table: StagingTable):
    """One connection for a task's transactions (one a range). Their commits do not wait for the WAL to
    reach the disk (statements.session): the batch's commit waits, and its flush covers every staging
    commit before it; a server crash before that loses only an attempt the batch then runs again."""
    import psycopg2

    conn = psycopg2.connect(table.dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(table.statements.session)
        yield conn
    finally:
        conn.close()


def copy_output(batches: Iterator, job: StagingJob) -> int:
    """COPY one task's share of a query's output in one transaction; returns the rows. Two rows for one
    record (or group), like a retry of a task that had committed, collide with the staging table's
    unique key and fail the attempt."""
    import psycopg2

    rows = 0

    def parts() -> Iterator[list]:
        nonlocal rows
        for batch in batches:
            rows += batch.num_rows
            yield staged_arrays(batch, job.output, job.batch_id)

    try:
        with staging_connection(job.table) as conn, conn, conn.cursor() as cur:
            copy_stream(cur, job.table.statements.copy_output, parts(), job.table.binary_types)
    except psycopg2.errors.UniqueViolation:
        raise RuntimeError("the query gave two rows for one " + (
            "key: an aggregate query groups by exactly target.key" if job.aggregate else
            "record (its _topic, _partition, _offset): an append or upsert query gives at most one row per record"
        )) from None
    return rows
