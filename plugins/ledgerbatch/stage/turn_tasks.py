"""Executor side of a turn (stage/turns.py): one Spark task stages its share of many pipelines' ranges.

A task's items are (job, range) pairs. Its small ranges are read through one consumer per Kafka settings
(source/together.py: a consumer a range waited for its first records, 100 of them one after another took
0.7-1.5 s against 0.05 s together); its big ones (a backlog) stream through reader.py job by job. Each range is
staged in its own transaction (tasks.py: stage_range, as a single pipeline's), on one connection per ledger database for the whole
task. A job's failure (its poison record, its offsets gone, its attempt fenced) becomes that job's error row,
not the task's failure, so one pipeline's trouble fails its own batch alone and the turn's other jobs are
staged as ever."""
from __future__ import annotations

import contextlib
import traceback
from dataclasses import dataclass, field
from typing import Iterator

from pyspark.sql.types import IntegerType, StringType, StructField, StructType

from ledgerbatch.stage.job import COUNTS, StagingJob
from ledgerbatch.stage.tasks import stage_range, staging_connection

TURN_COUNTS = StructType([*COUNTS.fields, StructField("job", IntegerType(), False),
                          StructField("error", StringType(), True)])
SMALL_SPAN = 2_000  # offsets: a range up to this is read with the task's others, its records held until it is complete
GROUP_SPAN = 20_000  # offsets read through one consumer at most: what a task holds at once (two of reader.py's chunks)


def stage_turn(ids: Iterator, jobs: tuple[StagingJob, ...], items: tuple[tuple[int, int], ...],
               shares: list[list[int]]) -> Iterator:
    """mapInArrow body over spark.range(len(shares)), a share a task: the (job, range) `items` of this task's
    shares, each job's counts (or its error) as TURN_COUNTS rows. A job's rows are held until all its ranges
    here are staged: a failed job gives its error only."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    mine = [items[i] for id_batch in ids for share in id_batch.column(0).to_pylist() for i in shares[share]]
    rows: dict[int, list[dict]] = {j: [] for j, _ in mine}
    failed: dict[int, str] = {}
    parsers: dict[int, object] = {}
    with _Connections() as connections:
        for j, rng, records in _reads(mine, jobs, failed):
            try:
                if isinstance(records, Exception):
                    raise records
                if j not in parsers:
                    parsers[j] = jobs[j].parsing.parser()
                rows[j].extend(stage_range(rng, records, parsers[j], jobs[j].table,
                                           connections.get(jobs[j].table)).to_pylist())
            except Exception as exc:  # noqa: BLE001 - the job's failure is its row: the driver raises it for that job
                failed[j] = _reason(exc)
                connections.forget_closed(jobs[j].table)
    schema = to_arrow_schema(TURN_COUNTS)
    for j, staged in rows.items():
        if j in failed:
            staged = [{"topic": "", "partition": -1, "rows": 0, "bad": 0, "deleted": 0, "skipped": 0, "stamps": None,
                       "error": failed[j]}]
        yield pa.RecordBatch.from_pylist([{**row, "job": j, "error": row.get("error")} for row in staged], schema=schema)


def _reads(mine: list[tuple[int, int]], jobs: tuple[StagingJob, ...], failed: dict) -> Iterator[tuple]:
    """(job, range, its records or the error that ended its read) for the task's ranges, none of a job in
    `failed`: the small ones read together (a group per Kafka settings, each partition once a group, at most
    GROUP_SPAN offsets), then the big ones a job at a time."""
    from ledgerbatch.source.reader import read_ranges
    from ledgerbatch.source.together import read_together

    for group in _groups([(j, jobs[j].ranges[r]) for j, r in mine if jobs[j].ranges[r].span <= SMALL_SPAN], jobs):
        owner = {(rng.topic, rng.partition): j for j, rng in group}
        job, unread = jobs[group[0][0]], set(owner)
        try:
            for rng, records in read_together([rng for j, rng in group if j not in failed], job.kafka,
                                              job.stall_timeout_s, bool(job.parsing.metadata)):
                unread.discard((rng.topic, rng.partition))
                if owner[(rng.topic, rng.partition)] not in failed:
                    yield owner[(rng.topic, rng.partition)], rng, records
        except Exception as exc:  # noqa: BLE001 - the consumer itself failed: the jobs it had still to read fail
            for tp in unread:
                failed.setdefault(owner[tp], _reason(exc))
    big: dict[int, list] = {}
    for j, r in mine:
        if jobs[j].ranges[r].span > SMALL_SPAN:
            big.setdefault(j, []).append(jobs[j].ranges[r])
    for j, ranges in big.items():
        try:
            with contextlib.closing(read_ranges(ranges, jobs[j].kafka, jobs[j].stall_timeout_s,
                                                bool(jobs[j].parsing.metadata))) as reads:
                for rng, records in reads:
                    if j in failed:
                        break
                    yield j, rng, records
        except Exception as exc:  # noqa: BLE001 - its consumer failed to start: the job's failure, not the task's
            failed.setdefault(j, _reason(exc))


def _reason(exc: BaseException) -> str:
    return traceback.format_exception_only(type(exc), exc)[-1].strip()


@dataclass
class _Group:
    """Ranges read through one consumer: one Kafka settings and metadata, each partition once."""
    key: tuple
    pairs: list = field(default_factory=list)  # (job, range)
    span: int = 0

    def takes(self, key: tuple, rng) -> bool:
        return key == self.key and self.span + rng.span <= GROUP_SPAN and all(
            (r.topic, r.partition) != (rng.topic, rng.partition) for _, r in self.pairs)


def _groups(small: list[tuple], jobs: tuple[StagingJob, ...]) -> list[list[tuple]]:
    """`small` (job, range) pairs in groups of one Kafka settings and metadata, a partition at most once a
    group (two pipelines may read one topic), GROUP_SPAN offsets at most."""
    groups: list[_Group] = []
    for j, rng in small:
        key = (tuple(sorted(jobs[j].kafka.items())), bool(jobs[j].parsing.metadata))
        group = next((g for g in groups if g.takes(key, rng)), None)
        if group is None:
            group = _Group(key)
            groups.append(group)
        group.pairs.append((j, rng))
        group.span += rng.span
    return [g.pairs for g in groups]


class _Connections(contextlib.ExitStack):
    """One staging connection per ledger database (staging_connection), opened when first needed."""

    def __init__(self):
        super().__init__()
        self._open: dict[str, object] = {}

    def get(self, table):
        if table.dsn not in self._open:
            self._open[table.dsn] = self.enter_context(staging_connection(table))
        return self._open[table.dsn]

    def forget_closed(self, table) -> None:
        """After a job's failure: a connection that died with it (a backend terminated, a proxy's cut) is
        opened anew for the next job, whose staging is not that job's trouble."""
        conn = self._open.get(table.dsn)
        if conn is not None and conn.closed:
            del self._open[table.dsn]
