"""Batches and their ranges in the ledger: plan, attempts, staged counts, commit, abandon.

ledger/ is the one door to the `ledger` schema: every read and write of it goes through its modules
(queries in sql/queries/ledger_*.sql); the rest of the package sees typed values (model/batch.py)."""
from __future__ import annotations

from sqlalchemy.engine import Connection

from ledgerbatch.errors import FENCED, FencedError, LedgerbatchError
from ledgerbatch.ledger.sql import run
from ledgerbatch.model.batch import Batch, BatchKind, BatchStatus
from ledgerbatch.model.ranges import OffsetRange, TopicPartition, range_arrays
from ledgerbatch.sqlfiles import Fragment, query

# -- migrations' own bookkeeping (ledger.schema_migrations)


# -- batches and ranges

def lock_pipeline(conn: Connection, pipeline: str) -> None:
    """Serialises planners of one pipeline for the rest of the transaction."""
    run(conn, "pipeline_lock", {"pipeline": pipeline})


def open_live_batch_id(conn: Connection, pipeline: str) -> int | None:
    row = run(conn, "open_live_batch", {"pipeline": pipeline}).first()
    return row.batch_id if row else None


def get_batch(conn: Connection, batch_id: int, for_update: bool = False) -> Batch:
    row = run(conn, "get_batch", {"batch_id": batch_id}, lock=Fragment("FOR UPDATE OF b" if for_update else "")).first()
    if row is None:
        raise LedgerbatchError(f"batch {batch_id} does not exist in ledger.batches")
    ranges = list(zip(row.range_topics or [], row.range_partitions or [], row.range_froms or [],
                      row.range_untils or [], row.range_reads or [], row.range_deletes or [], row.range_skips or []))
    return Batch(
        batch_id=row.batch_id, pipeline=row.pipeline, kind=BatchKind(row.kind), status=BatchStatus(row.status),
        attempt=row.attempt, staging_table=row.staging_table, records_read=row.records_read,
        rows_written=row.rows_written, rows_quarantined=row.rows_quarantined, error=row.error,
        ranges=tuple(OffsetRange(topic, partition, lo, hi) for topic, partition, lo, hi, *_ in ranges),
        range_counts={(topic, partition): read for topic, partition, _, _, read, *_ in ranges},
        records_filtered=row.records_filtered, groups_written=row.groups_written, output_schema=row.output_schema,
        rows_deleted=row.rows_deleted, records_skipped=row.records_skipped, spec_version=row.spec_version,
        rows_rejected=row.rows_rejected, records_superseded=row.records_superseded,
        range_changes={(topic, partition): (deleted, skipped) for topic, partition, *_, deleted, skipped in ranges},
    )


def insert_batch(conn: Connection, pipeline: str, kind: BatchKind, ranges: list[OffsetRange]) -> int:
    batch_id = run(conn, "insert_batch", {"pipeline": pipeline, "kind": kind.value}).scalar_one()
    if ranges:
        run(conn, "insert_ranges", {"batch_id": batch_id, "pipeline": pipeline, "kind": kind.value,
                                    **range_arrays(ranges)})
    return batch_id


def pin_spec_version(conn: Connection, batch_id: int, pipeline: str, version: str, spec_text: str) -> str:
    """Keep the spec's text under its version, and give the batch that version unless it has one already
    (a live batch gets it at its plan, a replay or backfill at its first attempt); returns the batch's."""
    run(conn, "record_spec_version", {"pipeline": pipeline, "version": version, "spec_text": spec_text})
    return run(conn, "pin_spec_version", {"batch_id": batch_id, "version": version}).scalar_one()


def begin_attempt(conn: Connection, batch_id: int, output_schema: str | None = None,
                  lease_s: float = 0.0) -> int | None:
    """Take ownership of an unfinished batch; earlier attempts are fenced from now on. A query
    transform's output columns (`output_schema`) are fixed for the attempt here. None while another
    attempt is staged under a lease renewed within `lease_s` seconds (stage/lease.py), or once another
    runner has committed the batch."""
    attempt = run(conn, "begin_attempt", {"batch_id": batch_id, "output_schema": output_schema,
                                          "lease_s": lease_s}).scalar_one_or_none()
    if attempt is None:
        status = get_batch(conn, batch_id).status
        if status == BatchStatus.COMMITTED or attempt_held(conn, batch_id, lease_s):
            return None
        raise FencedError(f"batch {batch_id} is {status}: there is nothing left to process")
    return attempt


def attempt_held(conn: Connection, batch_id: int, lease_s: float) -> bool:
    return bool(run(conn, "attempt_held", {"batch_id": batch_id, "lease_s": lease_s}).scalar_one())


def renew_lease(conn: Connection, batch_id: int, attempt: int) -> bool:
    """False once the attempt no longer owns the batch unstaged (staged, fenced or finished)."""
    return run(conn, "renew_lease", {"batch_id": batch_id, "attempt": attempt}).rowcount == 1


def staged_read_statement() -> str:
    """What a query pipeline's staging task runs (psycopg2) to record its range's counts."""
    return query("record_staged_read")


def mark_staged(conn: Connection, batch_id: int, attempt: int, staging: str, ranges: tuple[OffsetRange, ...],
                counts: dict[TopicPartition, tuple[int, int]], filtered: int = 0, groups: int | None = None) -> None:
    """Record the staged counts (records, bad) per range, or (records, bad, deleted, skipped) in change
    pipelines, fenced by attempt: a superseded attempt's result is refused. A query transform also
    dropped `filtered` good records (an aggregate's result holds `groups` rows)."""
    changes = any(len(c) > 2 for c in counts.values())  # a change pipeline's counts
    counts = {tp: tuple(c) + (0, 0) * (len(c) == 2) for tp, c in counts.items()}
    records = sum(c[0] for c in counts.values())
    bad = sum(c[1] for c in counts.values())
    deleted = sum(c[2] for c in counts.values())
    skipped = sum(c[3] for c in counts.values())
    marked = run(conn, "mark_staged", {
        "batch_id": batch_id, "attempt": attempt, "staging_table": staging, "records_read": records,
        "rows_written": records - bad - filtered, "rows_quarantined": bad, "records_filtered": filtered,
        "groups_written": groups,
    }).rowcount
    if marked != 1:
        raise FencedError(f"batch {batch_id} attempt {attempt} {FENCED}: staged result discarded")
    if changes:
        run(conn, "mark_staged_changes", {"batch_id": batch_id, "attempt": attempt, "rows_deleted": deleted,
                                          "records_skipped": skipped})
    per_range = [counts.pop(r.topic_partition, (0, 0, 0, 0)) for r in ranges]
    if counts:
        raise LedgerbatchError(f"rows staged for partitions outside the batch: {sorted(counts)}")
    set_ = run(conn, "set_range_counts", {
        "batch_id": batch_id, "changes": changes, "topics": [r.topic for r in ranges],
        "partitions": [r.partition for r in ranges], "records_read": [c[0] for c in per_range],
        "rows_deleted": [c[2] for c in per_range], "records_skipped": [c[3] for c in per_range]}).rowcount
    if set_ != len(ranges):
        raise LedgerbatchError(f"batch {batch_id}: counts set on {set_} of its {len(ranges)} ranges")


def staged_reads(conn: Connection, batch_id: int, attempt: int) -> dict[TopicPartition, tuple[int, int]]:
    """(records, bad) per range as a query pipeline's staging tasks recorded them for the attempt."""
    rows = run(conn, "staged_reads", {"batch_id": batch_id, "attempt": attempt})
    return {(r.topic, r.partition): (r.records, r.bad) for r in rows}


def mark_failed(conn: Connection, batch_id: int, attempt: int, error: str) -> bool:
    """Record why an attempt failed; false when a newer attempt already owns the batch."""
    return run(conn, "mark_failed", {"batch_id": batch_id, "attempt": attempt, "error": error[:4000]}).rowcount == 1


def mark_abandoned(conn: Connection, batch_id: int, reason: str) -> None:
    """An unfinished batch that will never commit (a dry run, ranges lost from Kafka)."""
    run(conn, "mark_abandoned", {"batch_id": batch_id, "reason": reason})


def mark_committed(conn: Connection, batch_id: int) -> None:
    run(conn, "mark_ranges_committed", {"batch_id": batch_id})
    run(conn, "mark_committed", {"batch_id": batch_id})
    run(conn, "forget_staged_reads", {"batch_id": batch_id})


def record_replaced(conn: Connection, batch_id: int, records: int) -> None:
    """A replay's commit: target rows and quarantined records of earlier deliveries it removed (append
    targets; `verify` counts with it)."""
    run(conn, "record_replaced", {"batch_id": batch_id, "records": records})


# Where staged rows the commit did not publish are counted, by batch and by range.
SET_ASIDE = {"rejected": ("rows_rejected", "records_rejected"),  # refused by the target (commit/rejects.py)
             "superseded": ("records_superseded", "records_superseded")}  # older (commit/modes/versioned.py)


def record_set_aside(conn: Connection, batch_id: int, why: str, by_range: dict[TopicPartition, int],
                     deletes: int) -> None:
    """Staged rows not published, per range (of them `deletes` were deletes): counted as `why`
    (SET_ASIDE), no longer as written or deleted."""
    batch_bucket, range_bucket = SET_ASIDE[why]
    run(conn, "record_set_aside", {"batch_id": batch_id, "rows": sum(by_range.values()), "deletes": deletes},
        bucket=batch_bucket)
    for (topic, partition), rows in by_range.items():
        run(conn, "record_range_set_aside", {"batch_id": batch_id, "topic": topic, "partition": partition,
                                             "rows": rows}, bucket=range_bucket)


def newest_committed_batch(conn: Connection, pipeline: str) -> int | None:
    """The highest id among the pipeline's committed batches (any kind)."""
    return run(conn, "newest_committed_batch", {"pipeline": pipeline}).scalar_one()


def known_pipelines(conn: Connection) -> list[str]:
    return [r.pipeline for r in run(conn, "known_pipelines")]


# -- cursors and what Kafka said


# -- quarantine and staging bookkeeping


def finished_staging_tables(conn: Connection, pipeline: str) -> list[str]:
    """Staging tables of the pipeline's finished batches (a crash can leave them)."""
    return [r.table_name for r in run(conn, "finished_staging_tables", {"pipeline": pipeline})]


# -- inspection: status, verify, reports


def delivering_batches(conn: Connection, pipeline: str, ranges, exclude_batch_id: int = 0) -> dict[int, list[OffsetRange]]:
    """Committed batches (but `exclude_batch_id`) that delivered any offset of `ranges`, with all their ranges."""
    out: dict[int, list[OffsetRange]] = {}
    rows = run(conn, "delivering_batches", {"pipeline": pipeline, "batch_id": exclude_batch_id, **range_arrays(ranges)})
    for r in rows:
        out.setdefault(r.batch_id, []).append(OffsetRange(r.topic, r.partition, r.from_offset, r.until_offset))
    return out


