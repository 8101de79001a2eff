"""The COPYs of staging, executor side: a range's parsed Arrow batches into its staging tables (good rows
in one streamed COPY, bad records in theirs), and the COPY data that psycopg2 sends: CSV, or PostgreSQL's
binary format (binary_copy.py) for good rows whose every column type it encodes."""
from __future__ import annotations

import functools
import itertools
from typing import Callable, Iterator, Sequence

from ledgerbatch.formats.schema import COORDINATE_NAMES
from ledgerbatch.model.statements import StagingStatements
from ledgerbatch.stage.job import BAD_COLUMNS, StagingTable

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
                                                       table.batch_id), table.binary_types)
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
                yield staged_arrays(batch, columns, batch_id)
            if self._held >= BAD_HELD:
                return
        self.done = True

    def _set_bad_aside(self, batch):
        good, bad = split_bad(batch)
        if bad is not None:
            self._bad.append(bad)
            self._held += bad.num_rows
            self.bad += bad.num_rows
        return good

    def take_bad(self) -> list:
        bad, self._bad, self._held = self._bad, [], 0
        return bad


def staged_arrays(batch, columns: Sequence[str], batch_id: int) -> list:
    """The arrays of `batch`'s `columns` and the batch id beside them, as every staged row ends with it."""
    import pyarrow as pa

    return [batch.column(n) for n in columns] + [pa.repeat(pa.scalar(batch_id, pa.int64()), batch.num_rows)]


def split_bad(batch):
    """A parsed batch as (its good rows, its bad records or None)."""
    import pyarrow.compute as pc

    errors = batch.column("_error")
    if errors.null_count == batch.num_rows:
        return batch, None
    is_bad = pc.is_valid(errors)
    return batch.filter(pc.invert(is_bad)), batch.filter(is_bad)


def stage_bad(cur, sql: StagingStatements, batch):
    """COPY a parsed batch's bad records to the attempt's bad table; returns the good rows and the bad count."""
    good, bad = split_bad(batch)
    if bad is None:
        return good, 0
    copy_stream(cur, sql.copy_bad, [[bad.column(n) for n in BAD_COLUMNS]])
    return good, bad.num_rows


class CopyStream:
    """The data of one COPY as psycopg2's copy_expert reads it: `encode` of each list of Arrow arrays in
    `parts`, made once the one before is sent, between `header` and `trailer`. COPY data needs no reply,
    so PostgreSQL parses and indexes one part while the task reads and parses the next, where a COPY a
    part waited for each. An error in `parts` is kept: psycopg2 reports it only as the server's "COPY
    from stdin failed"."""

    def __init__(self, parts: Iterator[list], encode: Callable[[list], bytes], header: bytes = b"",
                 trailer: bytes = b""):
        self._data = (d for d in self._pieces(parts, encode, header, trailer) if d)
        self.error: BaseException | None = None

    @classmethod
    def of(cls, parts: Iterator[list], binary_types: tuple[str, ...] = ()) -> CopyStream:
        """CSV, or the binary format with `binary_types` (the columns' types)."""
        if not binary_types:
            return cls(parts, _csv)
        from ledgerbatch.stage import binary_copy

        encode = functools.partial(binary_copy.binary_rows, pg_types=binary_types)
        return cls(parts, encode, binary_copy.HEADER, binary_copy.TRAILER)

    @staticmethod
    def _pieces(parts, encode, header: bytes, trailer: bytes) -> Iterator[bytes]:
        yield header
        for arrays in parts:
            if len(arrays[0]):
                yield encode(arrays)
        yield trailer

    def read(self, size: int = -1) -> bytes:
        try:
            return next(self._data, b"")
        except BaseException as exc:
            self.error = exc
            raise


def copy_stream(cur, sql: str, parts, binary_types: tuple[str, ...] = ()) -> None:
    """One COPY of every part (a list of Arrow arrays in the statement's column order): CSV, or binary
    with `binary_types` (the columns' types; `sql` then says FORMAT binary). None runs if `parts` is
    empty. An error in `parts` is raised as itself."""
    parts = iter(parts)
    first = next((p for p in parts if len(p[0])), None)
    if first is None:
        return
    stream = CopyStream.of(itertools.chain([first], parts), binary_types)
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
