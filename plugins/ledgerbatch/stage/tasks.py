"""Staging, executor side: what Spark tasks run to put a batch's parsed rows into its staging tables.

Good rows go to `bN_aM` in the target's shape (an append commit attaches that table as the batch's
partition), bad records to `bN_aM_bad`. Each range is staged in one transaction that first deletes
what an earlier try of it left, so a retried task never duplicates.

Every range is read and parsed inside a Python task, so raw values never cross into the JVM. Without a
transform, `stage_ranges` also stages them there. A per-column transform (Spark SQL) gets the parsed rows
(`parse_ranges`) and `stage_parsed` stages its output. A query transform (transform.py) may drop,
multiply or group records, so its pipelines stage each range's bad records and read counts as they are
parsed (`parse_good_rows`) and the query's output after it (`stage_output`). The driver side (driver.py)
starts them and records the counts.
"""
from __future__ import annotations

import contextlib
import itertools
from typing import Iterator

from ledgerbatch.formats.schema import COORDINATE_NAMES
from ledgerbatch.model.statements import StagingStatements
from ledgerbatch.stage.job import BAD_COLUMNS, COUNTS, OUTPUT_COUNTS, StagingJob, StagingTable

BAD_HELD = 10_000  # bad records a range's COPY of good rows holds back before it ends for theirs


def copy_range(batches: Iterator, table: StagingTable, conn) -> tuple[str, int, int, int, int, int] | None:
    """COPY the parsed Arrow batches of ONE range in one transaction on `conn`; returns (topic, partition,
    rows, bad, deleted, skipped), None if empty. Rows count every record; deleted and skipped ones only in
    change pipelines. The good rows go in one COPY as they are parsed (copy_stream); bad records are held
    back and get their own COPY after it, ending it early if BAD_HELD of them are waiting."""
    batches = (b for b in batches if b.num_rows)
    first = next(batches, None)
    if first is None:  # an immutable log gives a retry the same records: nothing to replace
        return None
    tally = _RangeTally(first.column("_topic")[0].as_py(), first.column("_partition")[0].as_py())
    batches = itertools.chain([first], batches)
    sql = table.statements
    with conn, conn.cursor() as cur:
        # A retried task replaces what an earlier try of it left behind, in the same transaction;
        # the lock keeps two concurrent tries of one task (speculation, a zombie) in turn.
        cur.execute(sql.lock, {"lock": f"{table.name}|{tally.topic}|{tally.partition}"})
        cur.execute(sql.delete, {"topic": tally.topic, "partition": tally.partition})
        while not tally.done:
            copy_stream(cur, sql.copy, tally.good_rows(batches, list(table.columns) + list(COORDINATE_NAMES),
                                                       table.batch_id))
            copy_stream(cur, sql.copy_bad, ([b.column(n) for n in BAD_COLUMNS] for b in tally.take_bad()))
    return tally.topic, tally.partition, tally.rows, tally.bad, tally.deleted, tally.skipped


class _RangeTally:
    """One range's parsed batches on their way to its COPYs: its counts, and the bad records held back."""

    def __init__(self, topic: str, partition: int):
        self.topic, self.partition = topic, partition
        self.rows = self.bad = self.deleted = self.skipped = 0
        self.done = False
        self._bad: list = []
        self._held = 0

    def good_rows(self, batches: Iterator, columns: list[str], batch_id: int) -> Iterator[list]:
        """Each batch's good rows as the arrays of `columns` and the batch id, until `batches` ends (done)
        or BAD_HELD bad records wait for their COPY."""
        import pyarrow as pa
        import pyarrow.compute as pc

        for batch in batches:
            if batch.column("_partition")[0].as_py() != self.partition or batch.column("_topic")[0].as_py() != self.topic:
                raise RuntimeError(f"staging task got rows of two partitions: {self.topic}[{self.partition}] and more")
            self.rows += batch.num_rows
            batch = self._set_bad_aside(batch)
            if batch.num_rows:
                if "_change" in batch.schema.names:
                    changes = batch.column("_change")
                    self.deleted += pc.sum(pc.equal(changes, "d")).as_py() or 0
                    self.skipped += pc.sum(pc.equal(changes, "s")).as_py() or 0
                batch_ids = pa.repeat(pa.scalar(batch_id, pa.int64()), batch.num_rows)
                yield [batch.column(n) for n in columns] + [batch_ids]
            if self._held >= BAD_HELD:
                return
        self.done = True

    def _set_bad_aside(self, batch):
        good, bad = _split_bad(batch)
        if bad is not None:
            self._bad.append(bad)
            self._held += bad.num_rows
            self.bad += bad.num_rows
        return good

    def take_bad(self) -> list:
        bad, self._bad, self._held = self._bad, [], 0
        return bad


def _split_bad(batch):
    """A parsed batch as (its good rows, its bad records or None)."""
    import pyarrow.compute as pc

    errors = batch.column("_error")
    if errors.null_count == batch.num_rows:
        return batch, None
    is_bad = pc.is_valid(errors)
    return batch.filter(pc.invert(is_bad)), batch.filter(is_bad)


def _stage_bad(cur, sql: StagingStatements, batch):
    """COPY a parsed batch's bad records to the attempt's bad table; returns the good rows and the bad count."""
    good, bad = _split_bad(batch)
    if bad is None:
        return good, 0
    copy_stream(cur, sql.copy_bad, [[bad.column(n) for n in BAD_COLUMNS]])
    return good, bad.num_rows


class CsvStream:
    """The data of one COPY as psycopg2's copy_expert reads it: the CSV of each list of Arrow arrays in
    `parts`, made once the one before is sent. COPY data needs no reply, so PostgreSQL parses and indexes
    one part while the task reads and parses the next, where a COPY a part waited for each. An error in
    `parts` is kept: psycopg2 reports it only as the server's "COPY from stdin failed"."""

    def __init__(self, parts: Iterator[list]):
        self._parts = parts
        self.error: BaseException | None = None

    def read(self, size: int = -1) -> bytes:
        try:
            for arrays in self._parts:
                if len(arrays[0]):
                    return _csv(arrays)
            return b""
        except BaseException as exc:
            self.error = exc
            raise


def copy_stream(cur, sql: str, parts) -> None:
    """One COPY of the CSV of every part (a list of Arrow arrays in the statement's column order); none
    runs if `parts` is empty. An error in `parts` is raised as itself."""
    parts = iter(parts)
    first = next((p for p in parts if len(p[0])), None)
    if first is None:
        return
    stream = CsvStream(itertools.chain([first], parts))
    try:
        cur.copy_expert(sql, stream)
    except Exception:
        if stream.error is not None:
            raise stream.error from None
        raise


def _csv(arrays: list) -> bytes:
    import pyarrow as pa
    import pyarrow.csv as pcsv

    sink = pa.BufferOutputStream()
    table = pa.Table.from_arrays([_csv_ready(a) for a in arrays], names=[str(i) for i in range(len(arrays))])
    pcsv.write_csv(table, sink, pcsv.WriteOptions(include_header=False))
    return sink.getvalue().to_pybytes()


def _csv_ready(array):
    """A UTC timestamp column as the text the CSV writer would give it: Arrow writes a naive timestamp ~40x
    faster than a zoned one (it looks the zone up per value), and the same instant with a "Z" is that text."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not pa.types.is_timestamp(array.type) or array.type.tz != "UTC":
        return array
    return pc.binary_join_element_wise(array.cast(pa.timestamp(array.type.unit)).cast(pa.string()), "Z", "")


def stage_ranges(ids: Iterator, job: StagingJob) -> Iterator:
    """mapInArrow body over spark.range(len(job.ranges)): read, parse and stage the ranges of this task."""
    parser = job.parsing.parser()
    with staging_connection(job.table) as conn:
        for rng, records in _task_ranges(ids, job):
            counts = copy_range(_parsed(rng, records, parser), job.table, conn)
            yield _counts(counts or (rng.topic, rng.partition, 0, 0, 0, 0))


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
                    batch, nbad = _stage_bad(cur, sql, batch)
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


def _counts(counts: tuple):
    """One range's counts as the COUNTS row its task returns."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    return pa.RecordBatch.from_pylist([dict(zip(COUNTS.names, counts))], schema=to_arrow_schema(COUNTS))


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
    import pyarrow as pa

    rows = 0

    def parts() -> Iterator[list]:
        nonlocal rows
        for batch in batches:
            rows += batch.num_rows
            yield [batch.column(n) for n in job.output] + [pa.repeat(pa.scalar(job.batch_id, pa.int64()), batch.num_rows)]

    try:
        with staging_connection(job.table) as conn, conn, conn.cursor() as cur:
            copy_stream(cur, job.table.statements.copy_output, parts())
    except psycopg2.errors.UniqueViolation:
        raise RuntimeError("the query gave two rows for one " + (
            "key: an aggregate query groups by exactly target.key" if job.aggregate else
            "record (its _topic, _partition, _offset): an append or upsert query gives at most one row per record"
        )) from None
    return rows
