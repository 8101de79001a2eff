"""Ranges as one short line for a log or the UI: partitions of one topic that share their offsets are written
once, consecutive ones as a run, e.g. `16 ranges: orders[0..15] [6250, 12500)`."""
from __future__ import annotations

from collections.abc import Iterable
from itertools import groupby

from ledgerbatch.model.ranges import OffsetRange


def _runs(numbers: list[int]) -> str:
    """Sorted partition numbers as runs: [0, 1, 2, 5] -> `0..2,5`."""
    runs: list[list[int]] = []
    for number in numbers:
        if runs and number == runs[-1][1] + 1:
            runs[-1][1] = number
        else:
            runs.append([number, number])
    return ",".join(f"{first}..{last}" if last > first else str(first) for first, last in runs)


def ranges_line(ranges: Iterable[OffsetRange]) -> str:
    """`topic[partitions] [from, until); ...`, one group per topic and pair of offsets."""
    key = lambda r: (r.topic, r.from_offset, r.until_offset)  # noqa: E731
    return "; ".join(f"{topic}[{_runs(sorted(r.partition for r in group))}] [{start}, {until})"
                     for (topic, start, until), group in groupby(sorted(ranges, key=key), key=key))


def compact_ranges(ranges: Iterable[OffsetRange]) -> str:
    """ranges_line with the number of ranges first: `16 ranges: orders[0..15] [6250, 12500)`."""
    ranges = list(ranges)
    return f"{len(ranges)} range{'' if len(ranges) == 1 else 's'}" + (f": {ranges_line(ranges)}" if ranges else "")
