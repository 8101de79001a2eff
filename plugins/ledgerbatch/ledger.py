"""Ledger access: every read and write of the `ledger` schema goes through here (queries in sql/queries)."""
from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.engine import Connection

from .errors import FencedError, LedgerbatchError
from .ranges import OffsetRange, TopicPartition
from .sqlfiles import query


@dataclass(frozen=True)
class Batch:
    batch_id: int
    pipeline: str
    kind: str
    status: str
    attempt: int
    staging_table: str | None
    records_read: int | None
    rows_written: int | None
    rows_quarantined: int | None
    error: str | None
    ranges: tuple[OffsetRange, ...]
    range_counts: dict[TopicPartition, int | None]

    @property
    def span(self) -> int:
        return sum(r.span for r in self.ranges)


def _run(conn: Connection, name: str, params: dict | None = None, **identifiers):
    return conn.execute(text(query(name, **identifiers)), params or {})


def lock_pipeline(conn: Connection, pipeline: str) -> None:
    """Serialises planners of one pipeline for the rest of the transaction."""
    _run(conn, "pipeline_lock", {"pipeline": pipeline})


def open_live_batch_id(conn: Connection, pipeline: str) -> int | None:
    row = _run(conn, "open_live_batch", {"pipeline": pipeline}).first()
    return row.batch_id if row else None


def get_batch(conn: Connection, batch_id: int, for_update: bool = False) -> Batch:
    row = _run(conn, "lock_batch" if for_update else "get_batch", {"batch_id": batch_id}).first()
    if row is None:
        raise LedgerbatchError(f"batch {batch_id} does not exist in ledger.batches")
    ranges = _run(conn, "get_ranges", {"batch_id": batch_id}).all()
    return Batch(
        batch_id=row.batch_id, pipeline=row.pipeline, kind=row.kind, status=row.status, attempt=row.attempt,
        staging_table=row.staging_table, records_read=row.records_read, rows_written=row.rows_written,
        rows_quarantined=row.rows_quarantined, error=row.error,
        ranges=tuple(OffsetRange(r.topic, r.partition, r.from_offset, r.until_offset) for r in ranges),
        range_counts={(r.topic, r.partition): r.records_read for r in ranges},
    )


def cursors(conn: Connection, pipeline: str) -> dict[TopicPartition, int]:
    return {(r.topic, r.partition): r.next_offset for r in _run(conn, "get_cursors", {"pipeline": pipeline})}


def init_cursors(conn: Connection, pipeline: str, starts: dict[TopicPartition, int]) -> None:
    for (topic, partition), offset in sorted(starts.items()):
        _run(conn, "init_cursor", {"pipeline": pipeline, "topic": topic, "partition": partition, "offset": offset})


def insert_batch(conn: Connection, pipeline: str, kind: str, ranges: list[OffsetRange]) -> int:
    batch_id = _run(conn, "insert_batch", {"pipeline": pipeline, "kind": kind}).scalar_one()
    for r in ranges:
        _run(conn, "insert_range", {
            "batch_id": batch_id, "pipeline": pipeline, "kind": kind, "topic": r.topic,
            "partition": r.partition, "from_offset": r.from_offset, "until_offset": r.until_offset,
        })
    return batch_id


def begin_attempt(conn: Connection, batch_id: int) -> int:
    """Take ownership of an unfinished batch; earlier attempts are fenced from now on."""
    attempt = _run(conn, "begin_attempt", {"batch_id": batch_id}).scalar_one_or_none()
    if attempt is None:
        status = get_batch(conn, batch_id).status
        raise FencedError(f"batch {batch_id} is {status}: there is nothing left to process")
    return attempt


def mark_failed(conn: Connection, batch_id: int, attempt: int, error: str) -> bool:
    """Record why an attempt failed; false when a newer attempt already owns the batch."""
    return _run(conn, "mark_failed", {"batch_id": batch_id, "attempt": attempt, "error": error[:4000]}).rowcount == 1


def advance_cursor(conn: Connection, pipeline: str, batch_id: int, r: OffsetRange) -> bool:
    """Compare-and-set: moves the cursor from `from` to `until` only if it still stands at `from`."""
    return _run(conn, "advance_cursor", {
        "pipeline": pipeline, "topic": r.topic, "partition": r.partition,
        "from_offset": r.from_offset, "until_offset": r.until_offset, "batch_id": batch_id,
    }).rowcount == 1


def mark_committed(conn: Connection, batch_id: int) -> None:
    _run(conn, "mark_ranges_committed", {"batch_id": batch_id})
    _run(conn, "mark_committed", {"batch_id": batch_id})


def table_columns(conn: Connection, schema: str, table: str) -> list:
    return _run(conn, "table_columns", {"schema": schema, "table": table}).all()
