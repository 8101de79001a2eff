"""How a batch's staged rows join a range-partitioned append target (pure logic; append.py does the I/O).

Partitions cover runs of batch ids: `[from, to)`, the newest `[from, MAXVALUE)` ("open"). A big
batch becomes a partition of its own: its staging table is attached as is (metadata only), and the
open partition before it is closed at its id. A small batch is copied into the partition that covers
its id, so partitions grow with big batches only, not with every batch.

Their number stays bounded (`target.partitions.max`): when there are more, a run of adjacent closed
partitions of like sizes merges into one (plan_rollup; rollup.py does it), so old rows are copied at most about
log2(batches) times in all and a query plans against a bounded number of partitions however many batches
there were.
"""
from __future__ import annotations

from dataclasses import dataclass

ATTACH_MIN_ROWS = 50_000  # below this, copying the rows costs less than another partition
MAX_PARTITIONS = 16  # a lookup plans in about 0.5 ms over 16 to 24 partitions (docs/benchmarks.md: python -m bench.partitions)
MAX_MERGE = 64  # partitions merged in one transaction, which locks each until it commits


@dataclass(frozen=True)
class Partition:
    name: str
    lower: int
    upper: int | None  # None: MAXVALUE (the open partition)
    size: int = 0  # bytes

    def covers(self, batch_id: int) -> bool:
        return self.lower <= batch_id and (self.upper is None or batch_id < self.upper)


@dataclass(frozen=True)
class Publish:
    """`attach`: attach the staging table as `[batch_id, upper)` (upper None: MAXVALUE), after closing
    `close` at batch_id when given. Otherwise INSERT … SELECT into the partition that covers the batch."""
    attach: bool
    upper: int | None = None
    close: Partition | None = None


def plan_publish(batch_id: int, rows: int, partitions: list[Partition], min_rows: int = ATTACH_MIN_ROWS,
                 newest_committed: int | None = None) -> Publish:
    """`newest_committed`: the pipeline's highest committed batch id. A replay planned after a live batch may
    commit before it, and its rows then sit in the open partition above this batch's id: closing that
    partition at this id would refuse them, so the batch is copied instead."""
    covering = next((p for p in partitions if p.covers(batch_id)), None)
    if covering is None:  # e.g. the first batch, or a batch planned before the newest partition
        later = [p.lower for p in partitions if p.lower > batch_id]
        return Publish(attach=True, upper=min(later) if later else None)
    if (covering.upper is None and covering.lower < batch_id and rows >= min_rows
            and (newest_committed is None or newest_committed < batch_id)):
        return Publish(attach=True, close=covering)
    return Publish(attach=False)


def plan_rollup(partitions: list[Partition], max_partitions: int) -> list[Partition]:
    """The adjacent closed partitions to merge into one so that `max_partitions` remain (none: within
    bounds; the open partition never merges; far over it, at most MAX_MERGE at a time). Of the runs of the
    length needed, one of like sizes (none more than twice another) if there is one, and of those the one that
    copies the fewest bytes: merging like sizes, as a binary counter carries, copies each row at most about
    log2(batches) times in all (a simulated week of 60,480 attached batches under the bound of 16: 13.3 times,
    the largest merge a fifth of the table: ../shared/repro/history-outages/repro_rollup_blocks_commits.py), where weighing sizes against
    their inequality copied a row 28 times, and always merging the smallest run copies a growing tail partition
    again for every batch (tests/unit/test_partitions.py)."""
    ordered = sorted(partitions, key=lambda p: p.lower)
    closed = [p for p in ordered if p.upper is not None]
    need = min(len(ordered) - max_partitions + 1, len(closed), MAX_MERGE)
    if need < 2:
        return []
    runs = [closed[i:i + need] for i in range(len(closed) - need + 1)]

    def cost(run: list[Partition]) -> tuple[bool, int, int]:
        sizes = [max(p.size, 1) for p in run]
        return max(sizes) > 2 * min(sizes), sum(sizes), run[0].lower
    return min(runs, key=cost)
