"""Staging writer: a PySpark Python Data Source that COPYs each task's rows into the attempt's staging table.

Each task holds exactly one offset range, replaces that range's rows in one transaction
(so a retried task never duplicates), and reports its counts. The job's commit marks the
batch `staged` with those counts, only if this attempt still owns the batch.
"""
from __future__ import annotations

import io
import itertools
import json
from dataclasses import dataclass, field
from typing import Iterator

from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

FORMAT = "ledgerbatch_staging"


@dataclass
class RangeCounts(WriterCommitMessage):
    counts: dict = field(default_factory=dict)  # (topic, partition) -> [rows, bad rows]


class StagingSink(DataSource):
    """Options: `dsn` (tasks) and `db_url` (commit) of the ledger database, `staging_table`,
    `lock_sql`, `delete_sql`, `copy_sql`, `mark_staged_sql`, `set_range_count_sql`, `batch_id`, `attempt`, `ranges`."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def writer(self, schema, overwrite: bool) -> "StagingWriter":
        return StagingWriter(self.options)


class _CsvStream(io.RawIOBase):
    """A file object over Arrow batches rendered as CSV, so one COPY streams a whole task."""

    def __init__(self, chunks: Iterator[bytes]):
        self._chunks, self._buffer = chunks, b""

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        while size < 0 or len(self._buffer) < size:
            chunk = next(self._chunks, None)
            if chunk is None:
                break
            self._buffer += chunk
        if size < 0:
            size = len(self._buffer)
        out, self._buffer = self._buffer[:size], self._buffer[size:]
        return out


class StagingWriter(DataSourceArrowWriter):
    def __init__(self, options: dict):
        self.options = dict(options)

    def write(self, iterator: Iterator) -> RangeCounts:
        import psycopg2
        import pyarrow.csv as pcsv

        batches = (b for b in iterator if b.num_rows)
        first = next(batches, None)
        if first is None:
            return RangeCounts()
        tp = (first.column("_topic")[0].as_py(), first.column("_partition")[0].as_py())
        counts = [0, 0]

        def chunks() -> Iterator[bytes]:
            for batch in itertools.chain([first], batches):
                if batch.column("_partition")[0].as_py() != tp[1] or batch.column("_topic")[0].as_py() != tp[0]:
                    raise RuntimeError(f"staging task got rows of two partitions: {tp} and more")
                counts[0] += batch.num_rows
                counts[1] += batch.num_rows - batch.column("_error").null_count
                sink = io.BytesIO()
                pcsv.write_csv(batch, sink, pcsv.WriteOptions(include_header=False))
                yield sink.getvalue()

        conn = psycopg2.connect(self.options["dsn"])
        try:
            with conn, conn.cursor() as cur:
                # A retried task replaces what an earlier try of it left behind, in the same transaction;
                # the lock keeps two concurrent tries of one task (speculation, a zombie) in turn.
                cur.execute(self.options["lock_sql"], (f"{self.options['staging_table']}|{tp[0]}|{tp[1]}",))
                cur.execute(self.options["delete_sql"], tp)
                cur.copy_expert(self.options["copy_sql"], _CsvStream(chunks()), size=1 << 20)
        finally:
            conn.close()
        return RangeCounts({f"{tp[0]}\t{tp[1]}": counts})

    def commit(self, messages: list) -> None:
        """Runs once on the driver host after every task succeeded: mark the batch staged, fenced by attempt."""
        from sqlalchemy import create_engine, text
        from sqlalchemy.pool import NullPool

        totals = {}
        for message in messages:
            for key, (rows, bad) in (message.counts if message else {}).items():
                topic, partition = key.split("\t")
                totals[(topic, int(partition))] = (rows, bad)
        o = self.options
        records = sum(r for r, _ in totals.values())
        bad = sum(b for _, b in totals.values())
        engine = create_engine(o["db_url"], poolclass=NullPool)
        try:
            with engine.begin() as conn:
                marked = conn.execute(text(o["mark_staged_sql"]), {
                    "batch_id": int(o["batch_id"]), "attempt": int(o["attempt"]),
                    "staging_table": o["staging_table"], "records_read": records,
                    "rows_written": records - bad, "rows_quarantined": bad,
                }).rowcount
                if marked != 1:
                    raise RuntimeError(
                        f"batch {o['batch_id']} attempt {o['attempt']} no longer owns the batch: staged result discarded"
                    )
                for r in json.loads(o["ranges"]):
                    rows, _ = totals.pop((r["topic"], r["partition"]), (0, 0))
                    conn.execute(text(o["set_range_count_sql"]), {
                        "batch_id": int(o["batch_id"]), "topic": r["topic"], "partition": r["partition"], "records_read": rows,
                    })
                if totals:
                    raise RuntimeError(f"rows staged for partitions outside the batch: {sorted(totals)}")
        finally:
            engine.dispose()

    def abort(self, messages: list) -> None:
        """Nothing to undo: the staging table belongs to this attempt and is dropped at commit."""
