"""A batch as the ledger records it (`Batch`, frozen), its typed states and kinds, and the pure rule
that says what kind of batch a range may become."""
from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from ledgerbatch.errors import LedgerbatchError
from ledgerbatch.model.ranges import OffsetRange, TopicPartition


class BatchStatus(StrEnum):
    PLANNED = "planned"
    STAGED = "staged"
    COMMITTED = "committed"
    FAILED = "failed"
    ABANDONED = "abandoned"


class BatchKind(StrEnum):
    LIVE = "live"
    BACKFILL = "backfill"
    REPLAY = "replay"


class RangeRefused(LedgerbatchError):
    """A range that may be neither replayed nor backfilled."""


def classify(overlap: int, span: int, until_offset: int, start_offset: int | None, from_offset: int = 0,
             horizon: int | None = None, unknown: int = 0, backfill_refused: str | None = None) -> BatchKind:
    """REPLAY when committed batches delivered all of the range, BACKFILL when it lies wholly before
    the pipeline's start and nothing delivered it; anything else would duplicate or skip (pure). A replay
    starting before the partition's replay `horizon` (ledger compaction) is refused; a backfill is refused
    with `backfill_refused`, the reason, when the ledger forgot what it needs to give the serial result
    (a change pipeline's compacted deletes). `unknown`: offsets of the range compacted before the ledger
    kept exact backfill spans (migration 015): counted as delivered, as they were, but the ledger cannot
    tell which of them a backfill delivered."""
    if start_offset is None:
        raise RangeRefused("the pipeline has not started on this partition: run it first")
    delivered = overlap + unknown
    if delivered == span:
        if horizon is not None and from_offset < horizon:
            raise RangeRefused(f"offsets before {horizon} were compacted (ledgerbatch compact) together with what "
                               f"lets a replay replace them (the deletes of a change pipeline, or an aggregate's "
                               f"per-batch contributions), so a replay there could bring back deleted keys or count "
                               f"records twice; the replay horizon is {horizon}: replay from {horizon} on")
        return BatchKind.REPLAY
    if delivered == 0 and until_offset <= start_offset:
        if backfill_refused:
            raise RangeRefused(f"no batch delivered these offsets, but a backfill of them is refused: {backfill_refused}")
        return BatchKind.BACKFILL
    if unknown:
        raise RangeRefused(f"{unknown} of its {span} offsets were compacted before the ledger kept exactly what "
                           f"backfills delivered (migration 015): it cannot tell which of them a backfill delivered, "
                           f"so a backfill there could deliver an offset twice; ledger.checkpoints.backfilled_unknown "
                           f"holds those offsets: replay a range wholly inside them, or backfill one wholly outside")
    raise RangeRefused(f"the range is neither fully delivered (replay) nor fully before the pipeline's start offset "
                       f"{start_offset} (backfill); {overlap} of its {span} offsets were delivered")


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
    rows_rejected: int = 0  # staged rows the target refused at publish, quarantined by the commit
    records_superseded: int = 0  # versioned upserts: changes older than their key's newest, not applied

    @property
    def span(self) -> int:
        return sum(r.span for r in self.ranges)
