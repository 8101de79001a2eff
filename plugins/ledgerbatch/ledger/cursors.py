"""Cursors and what Kafka said: where each partition of a pipeline stands, compare-and-set moves, end
offsets, lost ranges."""
from __future__ import annotations

from sqlalchemy.engine import Connection

from ledgerbatch.ledger.sql import run
from ledgerbatch.model.batch import BatchKind, RangeRefused, classify
from ledgerbatch.model.ranges import OffsetRange, TopicPartition, Watermarks, range_arrays


def get_cursors(conn: Connection, pipeline: str, topics: tuple[str, ...] | None = None) -> dict[TopicPartition, int]:
    """Every cursor of the pipeline, or those of `topics` (the spec's): a topic removed from the spec keeps
    its cursors in the ledger, unused, so that its history stays explained."""
    return {(r.topic, r.partition): r.next_offset for r in run(conn, "get_cursors", {"pipeline": pipeline})
            if topics is None or r.topic in topics}


def last_served(conn: Connection, pipeline: str) -> dict[TopicPartition, int]:
    """The batch that last moved each cursor (0: none yet)."""
    return {(r.topic, r.partition): r.last_batch_id or 0 for r in run(conn, "cursor_batches", {"pipeline": pipeline})}


def init_cursors(conn: Connection, pipeline: str, starts: dict[TopicPartition, int]) -> None:
    for (topic, partition), offset in sorted(starts.items()):
        run(conn, "init_cursor", {"pipeline": pipeline, "topic": topic, "partition": partition, "offset": offset})


def advance_cursors(conn: Connection, pipeline: str, batch_id: int, ranges: tuple[OffsetRange, ...]) -> list[OffsetRange]:
    """Compare-and-set: moves each range's cursor from `from` to `until` only if it still stands at `from`;
    the ranges whose cursor did not (the caller's transaction must then roll back the others' moves)."""
    moved = {(r.topic, r.partition) for r in run(conn, "advance_cursors", {
        "pipeline": pipeline, "batch_id": batch_id, **range_arrays(ranges)})}
    return [r for r in ranges if r.topic_partition not in moved]


def record_end_offsets(conn: Connection, pipeline: str, ends: dict[TopicPartition, Watermarks]) -> None:
    """Keep what Kafka said at this plan: `ledger.partition_lag` and `status` read lag from it without Kafka."""
    if ends:
        marks = sorted(ends.items())
        run(conn, "record_end_offsets", {
            "pipeline": pipeline, "topics": [tp[0] for tp, _ in marks], "partitions": [tp[1] for tp, _ in marks],
            "log_starts": [wm.low for _, wm in marks], "end_offsets": [wm.high for _, wm in marks]})


def range_kind(conn: Connection, pipeline: str, r: OffsetRange) -> BatchKind:
    """What `r` may be replayed as now (states.classify); raises RangeRefused naming the range."""
    params = {"pipeline": pipeline, "topic": r.topic, "partition": r.partition,
              "from_offset": r.from_offset, "until_offset": r.until_offset}
    cursor = run(conn, "cursor_of", params).first()
    delivered = run(conn, "delivered_overlap", params).one()
    horizon = run(conn, "replay_horizon", params).scalar()
    try:
        return classify(delivered.overlap, r.span, r.until_offset, cursor.start_offset if cursor else None,
                        r.from_offset, horizon, delivered.unknown, _backfill_refused(conn, pipeline))
    except RangeRefused as exc:
        raise RangeRefused(f"{r}: {exc}") from None


def _backfill_refused(conn: Connection, pipeline: str) -> str | None:
    """Why no backfill of the pipeline can give the serial result any more, or None. A change pipeline's
    compaction keeps the deletes while a backfill can reach offsets below the start (ledger_compact.sql:
    backfill_gaps); once it forgot some, a backfill's older change of such a key would bring it back."""
    forgotten = run(conn, "deletes_forgotten", {"pipeline": pipeline}).scalar_one()
    if not forgotten:
        return None
    return (f"compaction forgot {forgotten} deletes of this change pipeline (ledger.compactions.deletes_folded) "
            f"when no backfill could reach its offsets below the start, or before the ledger kept them for backfills "
            f"(migration 015); a backfill's change loses to any change of its key already delivered, so serially "
            f"those deletes win, but the ledger no longer knows their keys and the backfill would bring them back. Load "
            f"the older offsets into a new pipeline (source.start: earliest) instead")


def record_lost_range(conn: Connection, pipeline: str, r: OffsetRange, by: str, reason: str | None) -> bool:
    """Record offsets deleted from Kafka before delivery and move the cursor past them; false when
    the cursor no longer stands at the range's start."""
    params = {"pipeline": pipeline, "topic": r.topic, "partition": r.partition,
              "from_offset": r.from_offset, "until_offset": r.until_offset}
    run(conn, "insert_lost_range", {**params, "acknowledged_by": by, "reason": reason})
    return run(conn, "skip_lost_cursor", params).rowcount == 1
