"""Staging: COPY each offset range's parsed rows into the attempt's staging tables.

Good rows go to `bN_aM` in the target's shape (an append commit attaches that table as the batch's
partition), bad records to `bN_aM_bad`. Each range is staged in one transaction that first deletes
what an earlier try of it left, so a retried task never duplicates. Once every task has succeeded, the
driver marks the batch `staged` with the counts, only if this attempt still owns the batch.

Two ways in: `stage_ranges` reads, parses and stages whole ranges inside one Python task (no round
trip through the JVM); `StagingSink` stages a DataFrame, for pipelines whose transform is Spark SQL.
"""
from __future__ import annotations

import io
import itertools
import json
from dataclasses import dataclass, field
from typing import Iterator

from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from .ranges import OffsetRange

FORMAT = "ledgerbatch_staging"
COUNTS = StructType([
    StructField("topic", StringType(), False),
    StructField("partition", IntegerType(), False),
    StructField("rows", LongType(), False),
    StructField("bad", LongType(), False),
])
LINEAGE = ("_topic", "_partition", "_offset")
BAD_COLUMNS = LINEAGE + ("_error", "_key", "_value")


@dataclass(frozen=True)
class Target:
    """Where a task stages: the ledger database, the attempt's staging table and its statements
    (`tables.staging_sql`), the spec's column names and the batch id every good row carries."""
    dsn: str
    staging: str
    sql: dict
    columns: tuple[str, ...]
    batch_id: int


def copy_range(batches: Iterator, target: Target) -> tuple[str, int, int, int] | None:
    """COPY the parsed Arrow batches of ONE range; returns (topic, partition, rows, bad), None if empty."""
    import psycopg2
    import pyarrow as pa
    import pyarrow.compute as pc

    batches = (b for b in batches if b.num_rows)
    first = next(batches, None)
    if first is None:  # an immutable log gives a retry the same records: nothing to replace
        return None
    topic, partition = first.column("_topic")[0].as_py(), first.column("_partition")[0].as_py()
    rows = bad = 0
    good_columns = list(target.columns) + list(LINEAGE)
    conn = psycopg2.connect(target.dsn)
    try:
        with conn, conn.cursor() as cur:
            # A retried task replaces what an earlier try of it left behind, in the same transaction;
            # the lock keeps two concurrent tries of one task (speculation, a zombie) in turn.
            cur.execute(target.sql["lock"], {"lock": f"{target.staging}|{topic}|{partition}"})
            cur.execute(target.sql["delete"], {"topic": topic, "partition": partition})
            for batch in itertools.chain([first], batches):
                if batch.column("_partition")[0].as_py() != partition or batch.column("_topic")[0].as_py() != topic:
                    raise RuntimeError(f"staging task got rows of two partitions: {topic}[{partition}] and more")
                rows += batch.num_rows
                errors = batch.column("_error")
                if errors.null_count < batch.num_rows:
                    is_bad = pc.is_valid(errors)
                    bad_rows = batch.filter(is_bad)
                    bad += bad_rows.num_rows
                    _copy(cur, target.sql["copy_bad"], [bad_rows.column(n) for n in BAD_COLUMNS])
                    batch = batch.filter(pc.invert(is_bad))
                if batch.num_rows:
                    batch_ids = pa.repeat(pa.scalar(target.batch_id, pa.int64()), batch.num_rows)
                    _copy(cur, target.sql["copy"], [batch.column(n) for n in good_columns] + [batch_ids])
    finally:
        conn.close()
    return topic, partition, rows, bad


def _copy(cur, sql: str, arrays: list) -> None:
    import pyarrow as pa
    import pyarrow.csv as pcsv

    sink = io.BytesIO()
    table = pa.Table.from_arrays(arrays, names=[str(i) for i in range(len(arrays))])
    pcsv.write_csv(table, sink, pcsv.WriteOptions(include_header=False))
    sink.seek(0)
    cur.copy_expert(sql, sink, size=1 << 20)


def stage_ranges(ids: Iterator, ranges: list[dict], kafka: dict, stall_timeout_s: float, columns: tuple,
                 required: tuple[str, ...], target: Target) -> Iterator:
    """mapInArrow body over spark.range(len(ranges)): read, parse and stage the ranges of this task."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    from .parse import Parser
    from .source import read_messages

    schema = to_arrow_schema(COUNTS)
    parser = Parser(columns, required)
    for id_batch in ids:
        for i in id_batch.column(0).to_pylist():
            rng = OffsetRange.from_dict(ranges[i])
            parsed = (parser.parse(rng.topic, rng.partition, *chunk) for chunk in read_messages(rng, kafka, stall_timeout_s))
            topic, partition, rows, bad = copy_range(parsed, target) or (rng.topic, rng.partition, 0, 0)
            yield pa.RecordBatch.from_pylist([{"topic": topic, "partition": partition, "rows": rows, "bad": bad}],
                                             schema=schema)


def mark_staged(conn, sql: dict, batch_id: int, attempt: int, staging: str, ranges: list[dict],
                counts: dict[tuple[str, int], tuple[int, int]]) -> None:
    """Record the staged counts, fenced by attempt: a superseded attempt's result is refused."""
    from sqlalchemy import text

    records = sum(r for r, _ in counts.values())
    bad = sum(b for _, b in counts.values())
    marked = conn.execute(text(sql["mark_staged"]), {
        "batch_id": batch_id, "attempt": attempt, "staging_table": staging, "records_read": records,
        "rows_written": records - bad, "rows_quarantined": bad,
    }).rowcount
    if marked != 1:
        raise RuntimeError(f"batch {batch_id} attempt {attempt} no longer owns the batch: staged result discarded")
    counts = dict(counts)
    for r in ranges:
        rows, _ = counts.pop((r["topic"], r["partition"]), (0, 0))
        conn.execute(text(sql["set_range_count"]), {
            "batch_id": batch_id, "topic": r["topic"], "partition": r["partition"], "records_read": rows,
        })
    if counts:
        raise RuntimeError(f"rows staged for partitions outside the batch: {sorted(counts)}")


@dataclass
class RangeCounts(WriterCommitMessage):
    counts: dict = field(default_factory=dict)  # "topic\tpartition" -> [rows, bad rows]


class StagingSink(DataSource):
    """Options: `target` (JSON of Target), `db_url` (for the commit), `ledger_sql` (JSON: mark_staged,
    set_range_count), `attempt`, `ranges`."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def writer(self, schema, overwrite: bool) -> "StagingWriter":
        return StagingWriter(self.options)


class StagingWriter(DataSourceArrowWriter):
    def __init__(self, options: dict):
        self.options = dict(options)
        t = json.loads(self.options["target"])
        self.target = Target(t["dsn"], t["staging"], t["sql"], tuple(t["columns"]), t["batch_id"])

    def write(self, iterator: Iterator) -> RangeCounts:
        result = copy_range(iterator, self.target)
        if result is None:
            return RangeCounts()
        topic, partition, rows, bad = result
        return RangeCounts({f"{topic}\t{partition}": [rows, bad]})

    def commit(self, messages: list) -> None:
        """Runs once on the driver host after every task succeeded."""
        from sqlalchemy import create_engine
        from sqlalchemy.pool import NullPool

        counts = {}
        for message in messages:
            for key, (rows, bad) in (message.counts if message else {}).items():
                topic, partition = key.split("\t")
                if (topic, int(partition)) in counts:  # two tasks replaced each other's rows of one range
                    raise RuntimeError(f"{topic}[{partition}] was staged by two tasks: staged result discarded")
                counts[(topic, int(partition))] = (rows, bad)
        engine = create_engine(self.options["db_url"], poolclass=NullPool)
        try:
            with engine.begin() as conn:
                mark_staged(conn, json.loads(self.options["ledger_sql"]), self.target.batch_id,
                            int(self.options["attempt"]), self.target.staging, json.loads(self.options["ranges"]), counts)
        finally:
            engine.dispose()

    def abort(self, messages: list) -> None:
        """Nothing to undo: the staging tables belong to this attempt and are dropped when it ends."""
