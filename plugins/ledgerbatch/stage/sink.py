"""The staging sink: a PySpark Python Data Source writer that stages a DataFrame (per-column or query
transforms)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

from ledgerbatch.stage.job import StagingJob
from ledgerbatch.stage.tasks import copy_output, copy_range

STAGING_SINK = "ledgerbatch_staging"  # the data source name df.write.format takes


@dataclass
class RangeCounts(WriterCommitMessage):
    counts: dict = field(default_factory=dict)  # "topic\tpartition" -> [rows, bad rows, deleted, skipped]


class StagingSink(DataSource):
    """Options: `job` (StagingJob.encode()), `db_url` (for recording the staged counts)."""

    @classmethod
    def name(cls) -> str:
        return STAGING_SINK

    def writer(self, schema, overwrite: bool) -> "StagingWriter":
        return StagingWriter(self.options)


class StagingWriter(DataSourceArrowWriter):
    def __init__(self, options: dict):
        self.job = StagingJob.decode(options["job"])
        self.db_url = options["db_url"]

    def write(self, iterator: Iterator) -> RangeCounts:
        if self.job.output:
            return RangeCounts({"": [copy_output(iterator, self.job), 0]})
        result = copy_range(iterator, self.job.table)
        if result is None:
            return RangeCounts()
        topic, partition, *counts = result
        return RangeCounts({f"{topic}\t{partition}": counts})

    def commit(self, messages: list) -> None:
        """Runs once on the driver host after every task succeeded."""
        from sqlalchemy import create_engine
        from sqlalchemy.pool import NullPool

        from ledgerbatch.ledger.batches import mark_staged

        if self.job.output:
            return self._commit_query(sum(m.counts.get("", [0])[0] for m in messages if m))
        counts = {}
        for message in messages:
            for key, range_counts in (message.counts if message else {}).items():
                topic, partition = key.split("\t")
                if (topic, int(partition)) in counts:  # two tasks replaced each other's rows of one range
                    raise RuntimeError(f"{topic}[{partition}] was staged by two tasks: staged result discarded")
                counts[(topic, int(partition))] = tuple(range_counts)
        engine = create_engine(self.db_url, poolclass=NullPool)
        try:
            with engine.begin() as conn:
                job = self.job
                mark_staged(conn, job.batch_id, job.attempt, job.table.name, job.ranges, counts, job.mark)
        finally:
            engine.dispose()

    def _commit_query(self, output_rows: int) -> None:
        """Record a query pipeline's attempt: what its tasks read per range, and what the query made of it."""
        from sqlalchemy import create_engine
        from sqlalchemy.pool import NullPool

        from ledgerbatch.ledger.batches import mark_staged, staged_reads
        from ledgerbatch.model.reconcile import query_counts

        job = self.job
        engine = create_engine(self.db_url, poolclass=NullPool)
        try:
            with engine.begin() as conn:
                reads = staged_reads(conn, job.batch_id, job.attempt, job.mark)
                unread = [str(r) for r in job.ranges if r.topic_partition not in reads]
                if unread:
                    raise RuntimeError(f"the query did not read every range to its end ({', '.join(unread)}): "
                                       f"a LIMIT cannot be part of a pipeline's transform")
                filtered, groups = query_counts(reads, output_rows, job.aggregate)
                mark_staged(conn, job.batch_id, job.attempt, job.table.name, job.ranges, reads, job.mark,
                            filtered=filtered, groups=groups)
        finally:
            engine.dispose()

    def abort(self, messages: list) -> None:
        """Nothing to undo: the staging tables belong to this attempt and are dropped when it ends."""
