"""Ledger access: the one door to the `ledger` schema. Every read and write of it goes through here
(queries in sql/queries/ledger*.sql); the rest of the package sees typed values."""
from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.engine import Connection

from .errors import FENCED, FencedError, LedgerbatchError
from .ranges import OffsetRange, TopicPartition, Watermarks, range_arrays
from .sqlfiles import query
from .states import BatchKind, BatchStatus, RangeRefused, classify
from .statements import StagedMarkStatements


@dataclass(frozen=True)
class Batch:
    batch_id: int
    pipeline: str
    kind: BatchKind
    status: BatchStatus
    attempt: int
    staging_table: str | None
    records_read: int | None
    rows_written: int | None
    rows_quarantined: int | None
    error: str | None
    ranges: tuple[OffsetRange, ...]
    range_counts: dict[TopicPartition, int | None]
    records_filtered: int = 0  # good records a query transform dropped
    groups_written: int | None = None  # aggregate targets: the groups the batch's result holds
    output_schema: str | None = None  # query transforms: the output columns staged (Spark DDL)
    rows_deleted: int = 0  # change pipelines: records that deleted a key
    records_skipped: int = 0  # change pipelines: records skipped by design (tombstones)
    range_changes: dict[TopicPartition, tuple[int | None, int | None]] | None = None  # (deleted, skipped) per range
    spec_version: str | None = None  # the pipeline spec's version it was planned with (spec.version)

    @property
    def span(self) -> int:
        return sum(r.span for r in self.ranges)


def _run(conn: Connection, name: str, params: dict | list | None = None, **identifiers):
    return conn.execute(text(query(name, **identifiers)), params or {})


# -- migrations' own bookkeeping (ledger.schema_migrations)

def bootstrap(conn: Connection) -> None:
    """The ledger schema and its migrations table, under the migration lock."""
    _run(conn, "migration_lock")
    conn.exec_driver_sql(query("bootstrap"))


def lock_migrations(conn: Connection) -> None:
    _run(conn, "migration_lock")


def applied_migrations(conn: Connection) -> set[int]:
    if not _run(conn, "ledger_exists").scalar_one():
        return set()
    return {row.version for row in _run(conn, "applied_migrations")}


def record_migration(conn: Connection, version: int, name: str) -> None:
    _run(conn, "record_migration", {"version": version, "name": name})


# -- batches and ranges

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
        batch_id=row.batch_id, pipeline=row.pipeline, kind=BatchKind(row.kind), status=BatchStatus(row.status),
        attempt=row.attempt, staging_table=row.staging_table, records_read=row.records_read,
        rows_written=row.rows_written, rows_quarantined=row.rows_quarantined, error=row.error,
        ranges=tuple(OffsetRange(r.topic, r.partition, r.from_offset, r.until_offset) for r in ranges),
        range_counts={(r.topic, r.partition): r.records_read for r in ranges},
        records_filtered=row.records_filtered, groups_written=row.groups_written, output_schema=row.output_schema,
        rows_deleted=row.rows_deleted, records_skipped=row.records_skipped, spec_version=row.spec_version,
        range_changes={(r.topic, r.partition): (r.rows_deleted, r.records_skipped) for r in ranges},
    )


def insert_batch(conn: Connection, pipeline: str, kind: BatchKind, ranges: list[OffsetRange]) -> int:
    batch_id = _run(conn, "insert_batch", {"pipeline": pipeline, "kind": kind.value}).scalar_one()
    for r in ranges:
        _run(conn, "insert_range", {
            "batch_id": batch_id, "pipeline": pipeline, "kind": kind.value, "topic": r.topic,
            "partition": r.partition, "from_offset": r.from_offset, "until_offset": r.until_offset,
        })
    return batch_id


def pin_spec_version(conn: Connection, batch_id: int, pipeline: str, version: str, spec_text: str) -> str:
    """Keep the spec's text under its version, and give the batch that version unless it has one already
    (a live batch gets it at its plan, a replay or backfill at its first attempt); returns the batch's."""
    _run(conn, "record_spec_version", {"pipeline": pipeline, "version": version, "spec_text": spec_text})
    return _run(conn, "pin_spec_version", {"batch_id": batch_id, "version": version}).scalar_one()


def begin_attempt(conn: Connection, batch_id: int, output_schema: str | None = None) -> int:
    """Take ownership of an unfinished batch; earlier attempts are fenced from now on. A query
    transform's output columns (`output_schema`) are fixed for the attempt here."""
    attempt = _run(conn, "begin_attempt", {"batch_id": batch_id, "output_schema": output_schema}).scalar_one_or_none()
    if attempt is None:
        status = get_batch(conn, batch_id).status
        raise FencedError(f"batch {batch_id} is {status}: there is nothing left to process")
    return attempt


def staged_mark_statements() -> StagedMarkStatements:
    return StagedMarkStatements(query("mark_staged"), query("set_range_count"), query("staged_reads"),
                                query("mark_staged_changes"), query("set_range_changes"))


def staged_read_statement() -> str:
    """What a query pipeline's staging task runs (psycopg2) to record its range's counts."""
    return query("record_staged_read")


def mark_staged(conn: Connection, batch_id: int, attempt: int, staging: str, ranges: tuple[OffsetRange, ...],
                counts: dict[TopicPartition, tuple[int, int]], statements: StagedMarkStatements | None = None,
                filtered: int = 0, groups: int | None = None) -> None:
    """Record the staged counts (records, bad) per range, or (records, bad, deleted, skipped) in change
    pipelines, fenced by attempt: a superseded attempt's result is refused. A query transform also
    dropped `filtered` good records (an aggregate's result holds `groups` rows). `statements` come
    with a staging job whose writer may run without sql/."""
    sql = statements or staged_mark_statements()
    changes = any(len(c) > 2 for c in counts.values())  # a change pipeline's counts
    counts = {tp: tuple(c) + (0, 0) * (len(c) == 2) for tp, c in counts.items()}
    records = sum(c[0] for c in counts.values())
    bad = sum(c[1] for c in counts.values())
    deleted = sum(c[2] for c in counts.values())
    skipped = sum(c[3] for c in counts.values())
    marked = conn.execute(text(sql.mark), {
        "batch_id": batch_id, "attempt": attempt, "staging_table": staging, "records_read": records,
        "rows_written": records - bad - filtered, "rows_quarantined": bad, "records_filtered": filtered,
        "groups_written": groups,
    }).rowcount
    if marked != 1:
        raise FencedError(f"batch {batch_id} attempt {attempt} {FENCED}: staged result discarded")
    if changes:
        conn.execute(text(sql.mark_changes), {"batch_id": batch_id, "attempt": attempt, "rows_deleted": deleted,
                                              "records_skipped": skipped})
    for r in ranges:
        rows, _, range_deleted, range_skipped = counts.pop(r.topic_partition, (0, 0, 0, 0))
        where = {"batch_id": batch_id, "topic": r.topic, "partition": r.partition}
        conn.execute(text(sql.set_count), {**where, "records_read": rows})
        if changes:
            conn.execute(text(sql.set_range_changes), {**where, "rows_deleted": range_deleted,
                                                       "records_skipped": range_skipped})
    if counts:
        raise LedgerbatchError(f"rows staged for partitions outside the batch: {sorted(counts)}")


def staged_reads(conn: Connection, batch_id: int, attempt: int,
                 statements: StagedMarkStatements | None = None) -> dict[TopicPartition, tuple[int, int]]:
    """(records, bad) per range as a query pipeline's staging tasks recorded them for the attempt."""
    sql = (statements or staged_mark_statements()).reads
    rows = conn.execute(text(sql), {"batch_id": batch_id, "attempt": attempt})
    return {(r.topic, r.partition): (r.records, r.bad) for r in rows}


def mark_failed(conn: Connection, batch_id: int, attempt: int, error: str) -> bool:
    """Record why an attempt failed; false when a newer attempt already owns the batch."""
    return _run(conn, "mark_failed", {"batch_id": batch_id, "attempt": attempt, "error": error[:4000]}).rowcount == 1


def mark_abandoned(conn: Connection, batch_id: int, reason: str) -> None:
    """An unfinished batch that will never commit (a dry run, ranges lost from Kafka)."""
    _run(conn, "mark_abandoned", {"batch_id": batch_id, "reason": reason})


def mark_committed(conn: Connection, batch_id: int) -> None:
    _run(conn, "mark_ranges_committed", {"batch_id": batch_id})
    _run(conn, "mark_committed", {"batch_id": batch_id})
    _run(conn, "forget_staged_reads", {"batch_id": batch_id})


def known_pipelines(conn: Connection) -> list[str]:
    return [r.pipeline for r in _run(conn, "known_pipelines")]


# -- cursors and what Kafka said

def cursors(conn: Connection, pipeline: str) -> dict[TopicPartition, int]:
    return {(r.topic, r.partition): r.next_offset for r in _run(conn, "get_cursors", {"pipeline": pipeline})}


def init_cursors(conn: Connection, pipeline: str, starts: dict[TopicPartition, int]) -> None:
    for (topic, partition), offset in sorted(starts.items()):
        _run(conn, "init_cursor", {"pipeline": pipeline, "topic": topic, "partition": partition, "offset": offset})


def advance_cursor(conn: Connection, pipeline: str, batch_id: int, r: OffsetRange) -> bool:
    """Compare-and-set: moves the cursor from `from` to `until` only if it still stands at `from`."""
    return _run(conn, "advance_cursor", {
        "pipeline": pipeline, "topic": r.topic, "partition": r.partition,
        "from_offset": r.from_offset, "until_offset": r.until_offset, "batch_id": batch_id,
    }).rowcount == 1


def record_end_offsets(conn: Connection, pipeline: str, ends: dict[TopicPartition, Watermarks]) -> None:
    """Keep what Kafka said at this plan: `ledger.partition_lag` and `status` read lag from it without Kafka."""
    if ends:
        _run(conn, "record_end_offset", [
            {"pipeline": pipeline, "topic": topic, "partition": partition, "log_start": wm.low, "end_offset": wm.high}
            for (topic, partition), wm in sorted(ends.items())
        ])


def range_kind(conn: Connection, pipeline: str, r: OffsetRange) -> BatchKind:
    """What `r` may be replayed as now (states.classify); raises RangeRefused naming the range."""
    params = {"pipeline": pipeline, "topic": r.topic, "partition": r.partition,
              "from_offset": r.from_offset, "until_offset": r.until_offset}
    cursor = _run(conn, "cursor_of", params).first()
    overlap = _run(conn, "delivered_overlap", params).scalar_one()
    try:
        return classify(overlap, r.span, r.until_offset, cursor.start_offset if cursor else None)
    except RangeRefused as exc:
        raise RangeRefused(f"{r}: {exc}") from None


def record_lost_range(conn: Connection, pipeline: str, r: OffsetRange, by: str, reason: str | None) -> bool:
    """Record offsets deleted from Kafka before delivery and move the cursor past them; false when
    the cursor no longer stands at the range's start."""
    params = {"pipeline": pipeline, "topic": r.topic, "partition": r.partition,
              "from_offset": r.from_offset, "until_offset": r.until_offset}
    _run(conn, "insert_lost_range", {**params, "acknowledged_by": by, "reason": reason})
    return _run(conn, "skip_lost_cursor", params).rowcount == 1


# -- quarantine and staging bookkeeping

def quarantine_staged(conn: Connection, bad_table: str, batch_id: int, pipeline: str) -> int:
    """Move an attempt's bad records into ledger.quarantine; returns how many."""
    return _run(conn, "insert_quarantine", {"batch_id": batch_id, "pipeline": pipeline}, bad=bad_table).rowcount


def clear_quarantine(conn: Connection, batch_id: int) -> None:
    """A replay replaces what earlier deliveries of its ranges quarantined."""
    _run(conn, "delete_quarantine_in_ranges", {"batch_id": batch_id})


def quarantined_count(conn: Connection, pipeline: str) -> int:
    return _run(conn, "quarantined_count", {"pipeline": pipeline}).scalar_one()


def finished_staging_tables(conn: Connection, pipeline: str) -> list[str]:
    """Staging tables of the pipeline's finished batches (a crash can leave them)."""
    return [r.table_name for r in _run(conn, "finished_staging_tables", {"pipeline": pipeline})]


# -- inspection: status, verify, reports

def partition_status(conn: Connection, pipeline: str) -> list:
    return _run(conn, "status_partitions", {"pipeline": pipeline}).all()


def recent_batches(conn: Connection, pipeline: str, limit: int) -> list:
    return _run(conn, "status_batches", {"pipeline": pipeline, "limit": limit}).all()


def last_error(conn: Connection, pipeline: str):
    return _run(conn, "status_last_error", {"pipeline": pipeline}).first()


def violations(conn: Connection, pipeline: str) -> list[str]:
    """The ledger's own invariant violations (the view ledger.invariant_violations)."""
    return [row.problem for row in _run(conn, "verify_ledger", {"pipeline": pipeline})]


def target_violations(conn: Connection, pipeline: str, schema: str, table: str, counts_add_up: bool) -> list[str]:
    """Target rows against the ledger; with `counts_add_up` (append targets) also rows + quarantined
    = records read by committed batches."""
    params, target = {"pipeline": pipeline}, dict(schema=schema, table=table)
    problems = [row.problem for row in _run(conn, "verify_target_rows", params, **target)]
    if counts_add_up:
        problems += [row.problem for row in _run(conn, "verify_append_counts", params, **target)]
    return problems


def deleted_key_violations(conn: Connection, pipeline: str, target: dict, deletes: str, key) -> list[str]:
    """A change pipeline's target and its deleted keys (ledger_deletes): every deleted key's delete comes
    from a committed batch inside a committed range, and no key is both a row and deleted."""
    from .identifiers import quote_ident
    from .sqlfiles import Fragment

    problems = target_violations(conn, pipeline, "ledger_deletes", deletes, False)
    match = Fragment(" AND ".join(f"t.{quote_ident(k)} = d.{quote_ident(k)}" for k in key))
    key_t = Fragment(", ".join(f"t.{quote_ident(k)}" for k in key))
    return problems + [row.problem for row in _run(conn, "verify_deleted_keys", {"deletes": deletes}, deletes=deletes,
                                                   match=match, key_t=key_t, **target)]


def report(conn: Connection, name: str) -> tuple[str, object]:
    """A named inspection query (report_*) with its SQL text, for printing both."""
    sql = query(name)
    return sql, conn.execute(text(sql))


def delivering_batches(conn: Connection, pipeline: str, ranges, exclude_batch_id: int = 0) -> dict[int, list[OffsetRange]]:
    """Committed batches (but `exclude_batch_id`) that delivered any offset of `ranges`, with all their ranges."""
    out: dict[int, list[OffsetRange]] = {}
    rows = _run(conn, "delivering_batches", {"pipeline": pipeline, "batch_id": exclude_batch_id, **range_arrays(ranges)})
    for r in rows:
        out.setdefault(r.batch_id, []).append(OffsetRange(r.topic, r.partition, r.from_offset, r.until_offset))
    return out


def aggregate_violations(conn: Connection, pipeline: str, target: dict, contributions: str, key, measures_agg,
                         differs) -> list[str]:
    """An aggregate target against its contributions and the ledger (sql/queries/ledger_verify.sql)."""
    return [row.problem for row in _run(conn, "verify_aggregate", {"pipeline": pipeline}, contributions=contributions,
                                        key=key, measures_agg=measures_agg, differs=differs, **target)]
