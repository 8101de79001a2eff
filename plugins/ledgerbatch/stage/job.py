"""One attempt's staging as every task sees it: the job (pickled to executors) and the table it stages
into."""
from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from ledgerbatch.formats.schema import COORDINATE_NAMES, Column
from ledgerbatch.model.ranges import OffsetRange
from ledgerbatch.model.statements import StagingStatements

COUNTS = StructType([
    StructField("topic", StringType(), False),
    StructField("partition", IntegerType(), False),
    StructField("rows", LongType(), False),
    StructField("bad", LongType(), False),
    StructField("deleted", LongType(), False),  # change pipelines: deletes and skipped records among the rows
    StructField("skipped", LongType(), False),
    StructField("stamps", StringType(), True),  # its records by timestamp (stamps.py), for the freshness metric
])

OUTPUT_COUNTS = StructType([StructField("rows", LongType(), False)])  # a query's output rows one task staged

BAD_COLUMNS = COORDINATE_NAMES + ("_error", "_key", "_value")


@dataclass(frozen=True)
class Parsing:
    """How a task turns records into rows: the spec's columns, its key columns (a record without them is
    bad), the format and its options, the Kafka metadata columns (spec.metadata), and whether every record
    is a change (spec.changes: rows carry parse.CHANGE)."""
    columns: tuple[Column, ...]
    required: tuple[str, ...]
    fmt: str
    format_options: dict
    metadata: tuple[str, ...]
    changes: bool

    @classmethod
    def of(cls, spec) -> Parsing:
        """A PipelineSpec's."""
        return cls(spec.columns, spec.required, spec.format, dict(spec.format_options), spec.metadata, spec.changes)

    def parser(self):
        from ledgerbatch.formats.parse import make_parser

        return make_parser(self.columns, self.required, self.fmt, self.format_options, self.metadata, self.changes)


@dataclass(frozen=True)
class StagingTable:
    """Where a task stages: the ledger database, the attempt's staging table and its statements, the
    spec's column names and the batch id every good row carries. `binary_types`: the types of the good
    rows' COPY columns where it is binary (statements.copy says so), else empty: CSV."""
    dsn: str
    name: str
    statements: StagingStatements
    columns: tuple[str, ...]
    batch_id: int
    binary_types: tuple[str, ...] = ()


@dataclass(frozen=True)
class StagingJob:
    """One attempt's staging, as every task sees it (pickled to executors)."""
    batch_id: int
    attempt: int
    ranges: tuple[OffsetRange, ...]
    kafka: dict
    stall_timeout_s: float
    parsing: Parsing
    table: StagingTable
    output: tuple[str, ...] = ()  # query pipelines: the output columns, in the COPY's order
    inputs: tuple[str, ...] = ()  # query pipelines: the columns of `batch` the query reads (transform.query_inputs)
    aggregate: bool = False  # the output is groups, not rows of records
