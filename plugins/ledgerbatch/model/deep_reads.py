"""What `verify --deep` reads again, and in how many reads (pure logic; ops/deep_verify.py does the I/O).

The ranges to check come as entries (batch id, range): the batch id is None for ranges checked one by
one (append, upsert), and an aggregate's standing batch otherwise, whose ranges go together: a batch's
groups are made by all its records. A read is one batch of the ledger, which holds one range per
partition, so ranges of a partition that do not touch (a sample, a backfill below the start) are read in
reads of their own.
"""
from __future__ import annotations

from collections import defaultdict

from ledgerbatch.model.ranges import OffsetRange, TopicPartition, Watermarks

Entry = tuple[int | None, OffsetRange]


def held(entries: list[Entry], ends: dict[TopicPartition, Watermarks]) -> tuple[list[Entry], list[OffsetRange]]:
    """The entries split at each partition's log start into what Kafka still holds and what it does not
    (merged). A batch Kafka no longer holds whole is not checkable at all."""
    lows = [ends[r.topic_partition].low if r.topic_partition in ends else r.until_offset for _, r in entries]
    gone = {batch_id for (batch_id, r), low in zip(entries, lows) if batch_id is not None and r.from_offset < low}
    kept, lost = [], []
    for (batch_id, r), low in zip(entries, lows):
        if batch_id in gone:
            lost.append(r)
            continue
        if r.from_offset < low:
            lost.append(OffsetRange(r.topic, r.partition, r.from_offset, min(low, r.until_offset)))
        if low < r.until_offset:
            kept.append((batch_id, OffsetRange(r.topic, r.partition, max(low, r.from_offset), r.until_offset)))
    return kept, merged(sorted(lost))


def layers(entries: list[Entry]) -> list[list[Entry]]:
    """The entries in as few reads as can hold them: in each, every partition's ranges touch end to end.
    Single ranges are merged first; a batch's ranges go into the first read where each of them fits."""
    batches: dict[int | None, list[OffsetRange]] = defaultdict(list)
    for batch_id, r in entries:
        batches[batch_id].append(r)
    units = [[(None, r)] for r in merged(sorted(batches.pop(None, [])))]
    units += [[(b, r) for r in sorted(rs)] for b, rs in batches.items()]
    units.sort(key=lambda unit: min((r.from_offset, r.topic, r.partition) for _, r in unit))
    reads: list[tuple[dict[TopicPartition, int], list[Entry]]] = []  # (each partition's end so far, entries)
    for unit in units:
        fits = next((read for read in reads if all(read[0].get(r.topic_partition, r.from_offset) == r.from_offset
                                                  for _, r in unit)), None)
        if fits is None:
            fits = ({}, [])
            reads.append(fits)
        for entry in unit:
            fits[0][entry[1].topic_partition] = entry[1].until_offset
            fits[1].append(entry)
    return [entries for _, entries in reads]


def read_of(layer: list[Entry]) -> tuple[list[OffsetRange], list[int]]:
    """A read's ranges (one per partition) and the batches they stand for."""
    return merged(sorted(r for _, r in layer)), sorted({b for b, _ in layer if b is not None})


def merged(ranges: list[OffsetRange]) -> list[OffsetRange]:
    """Adjacent ranges of a partition as one (ranges sorted by partition and offset)."""
    out: list[OffsetRange] = []
    for r in ranges:
        last = out[-1] if out else None
        if last and last.topic_partition == r.topic_partition and last.until_offset == r.from_offset:
            out[-1] = OffsetRange(r.topic, r.partition, last.from_offset, r.until_offset)
        else:
            out.append(r)
    return out
