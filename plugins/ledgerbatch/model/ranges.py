"""The offset-range value object and the pure planning math (no I/O)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from ledgerbatch.errors import DataLossError, LedgerbatchError

TopicPartition = tuple[str, int]


@dataclass(frozen=True, order=True)
class OffsetRange:
    """Offsets [from_offset, until_offset) of one topic-partition. Offsets may have gaps inside."""

    topic: str
    partition: int
    from_offset: int
    until_offset: int

    def __post_init__(self):
        if not 0 <= self.from_offset <= self.until_offset:
            raise ValueError(f"invalid range {self}")

    @property
    def span(self) -> int:
        return self.until_offset - self.from_offset

    @property
    def topic_partition(self) -> TopicPartition:
        return self.topic, self.partition

    def to_dict(self) -> dict:
        return {"topic": self.topic, "partition": self.partition, "from": self.from_offset, "until": self.until_offset}

    @classmethod
    def from_dict(cls, d: dict) -> "OffsetRange":
        return cls(d["topic"], int(d["partition"]), int(d["from"]), int(d["until"]))

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}] [{self.from_offset}, {self.until_offset})"


@dataclass(frozen=True)
class Watermarks:
    low: int  # first offset still in the log
    high: int  # last stable offset + 1 (read_committed)


def start_offsets(partitions: dict[TopicPartition, Watermarks], cursors: dict[TopicPartition, int], start: str,
                  at: dict[TopicPartition, int] | None = None) -> dict[TopicPartition, int]:
    """Cursor of every partition: the ledger's where it has one, else the log start or end per `start`, or
    for a start at a time, the offsets Kafka found at that time (`at`)."""
    out = dict(cursors)  # including partitions Kafka no longer has: check_cursors refuses those
    for tp, wm in partitions.items():
        out.setdefault(tp, (at or {}).get(tp, wm.low if start in ("earliest", "time") else wm.high))
    return out


def check_cursors(partitions: dict[TopicPartition, Watermarks], cursors: dict[TopicPartition, int]) -> None:
    """A cursor outside the log means lost data or a recreated topic: never skip it silently."""
    for tp, pos in sorted(cursors.items()):
        if tp not in partitions:
            raise LedgerbatchError(f"{tp[0]}[{tp[1]}] has a cursor in the ledger but no longer exists in Kafka: if the "
                                   f"topic is retired, remove it from the spec's source.topics (its cursors stay in "
                                   f"the ledger, unused)")
        wm = partitions[tp]
        if pos < wm.low:
            raise DataLossError(
                f"{tp[0]}[{tp[1]}]: cursor {pos} is before the log start {wm.low}: "
                f"offsets [{pos}, {wm.low}) were deleted from Kafka before they were delivered "
                f"(after checking, record the loss with `ledgerbatch acknowledge-loss PIPELINE --by NAME`)"
            )
        if pos > wm.high:
            raise LedgerbatchError(
                f"{tp[0]}[{tp[1]}]: cursor {pos} is past the log end {wm.high} (was the topic recreated?)"
            )


def split_budget(lags: dict[TopicPartition, int], budget: int,
                 last_served: dict[TopicPartition, int] | None = None) -> dict[TopicPartition, int]:
    """Max-min fair share of `budget` offsets: small lags are served whole, the rest split evenly. A budget
    smaller than the partitions with lag gives one offset each to those served longest ago (`last_served`:
    the batch that last moved each cursor), so every partition is served in turn and none starves."""
    alloc: dict[TopicPartition, int] = {}
    if 0 < budget < sum(1 for lag in lags.values() if lag > 0):
        waiting = sorted((tp for tp, lag in lags.items() if lag > 0), key=lambda tp: ((last_served or {}).get(tp, 0), tp))
        return {tp: 1 for tp in waiting[:budget]}
    pending = sorted((lag, tp) for tp, lag in lags.items() if lag > 0)
    remaining = budget
    for i, (lag, tp) in enumerate(pending):
        take = min(lag, remaining // (len(pending) - i))
        if take:
            alloc[tp] = take
        remaining -= take
    return alloc


def plan_ranges(partitions: dict[TopicPartition, Watermarks], cursors: dict[TopicPartition, int], max_records: int,
                per_partition: int | None = None, last_served: dict[TopicPartition, int] | None = None) -> list[OffsetRange]:
    """Next batch's ranges from the cursors up to the end offsets, at most `max_records` offsets in all and
    `per_partition` in one partition (split_budget; `last_served` as there)."""
    check_cursors(partitions, cursors)
    lags = {tp: min(partitions[tp].high - pos, per_partition or max_records) for tp, pos in cursors.items()}
    alloc = split_budget(lags, max_records, last_served)
    return sorted(OffsetRange(tp[0], tp[1], cursors[tp], cursors[tp] + n) for tp, n in alloc.items())


def cut_at_bytes(rng: OffsetRange, chunks: Iterable[tuple[list[int], list[int]]], max_bytes: int) -> OffsetRange:
    """`rng` stopped before the first record whose value would take the range past `max_bytes`; `chunks`
    are the range's (offsets, value sizes) in order. The first record is always kept, so one record larger
    than the budget still moves instead of wedging the partition."""
    total = 0
    for offsets, sizes in chunks:
        for offset, size in zip(offsets, sizes):
            if total and total + size > max_bytes:
                return OffsetRange(rng.topic, rng.partition, rng.from_offset, offset)
            total += size
    return rng


def range_arrays(ranges: tuple[OffsetRange, ...] | list[OffsetRange]) -> dict[str, list]:
    """Ranges as the parallel arrays SQL unnests (:topics, :partitions, :from_offsets, :until_offsets)."""
    return {"topics": [r.topic for r in ranges], "partitions": [r.partition for r in ranges],
            "from_offsets": [r.from_offset for r in ranges], "until_offsets": [r.until_offset for r in ranges]}


def covers(outer, inner) -> bool:
    """Every range of `inner` lies inside the range of its partition in `outer`."""
    by_tp = {r.topic_partition: r for r in outer}
    return all(r.topic_partition in by_tp and by_tp[r.topic_partition].from_offset <= r.from_offset
               and r.until_offset <= by_tp[r.topic_partition].until_offset for r in inner if r.span)


def widen(requested, delivered) -> list[OffsetRange]:
    """`requested` grown to cover each range of `delivered` (per partition: the smallest range holding
    both). Empty delivered ranges add nothing."""
    bounds: dict[TopicPartition, tuple[int, int]] = {r.topic_partition: (r.from_offset, r.until_offset) for r in requested}
    for r in delivered:
        if r.span:
            low, high = bounds.get(r.topic_partition, (r.from_offset, r.until_offset))
            bounds[r.topic_partition] = (min(low, r.from_offset), max(high, r.until_offset))
    return [OffsetRange(t, p, low, high) for (t, p), (low, high) in sorted(bounds.items())]


def too_early(pending: int, min_records: int, oldest_age_s: float | None, max_delay_s: float) -> bool:
    """Whether to wait for more records before planning: fewer than `min_records` offsets are pending and
    the oldest of them (its record's age, None when unknown) is younger than `max_delay_s`."""
    return 0 < pending < min_records and oldest_age_s is not None and oldest_age_s < max_delay_s


def newest_ranges(partitions: dict[TopicPartition, Watermarks], records: int, most: int) -> tuple[OffsetRange, ...]:
    """About `records` of the newest offsets, shared evenly among the first `most` partitions that hold any
    (a warm-up's sample: whatever the log holds, delivered or not)."""
    held = dict([(tp, w) for tp, w in sorted(partitions.items()) if w.high > w.low][:most])
    if not held or records <= 0:
        return ()
    each = -(-records // len(held))
    return tuple(OffsetRange(t, p, max(w.low, w.high - each), w.high) for (t, p), w in held.items())


RANGE_COST = 200  # offsets a range costs a task whatever its size (its transaction, its parser's start)


def share_out(spans: list[int], shares: int) -> list[list[int]]:
    """The indexes of `spans` (ranges' sizes in offsets) in at most `shares` lists of about equal work, the
    biggest first each to the least loaded (longest processing time first): a turn lasts as long as its
    busiest task, so one pipeline's big ranges are spread over the tasks instead of all landing in one."""
    loads = [[0, []] for _ in range(max(1, min(shares, len(spans))))]
    for i in sorted(range(len(spans)), key=lambda i: -spans[i]):
        least = min(loads, key=lambda load: (load[0], len(load[1])))
        least[0] += spans[i] + RANGE_COST
        least[1].append(i)
    return [sorted(indexes) for _, indexes in loads if indexes]
