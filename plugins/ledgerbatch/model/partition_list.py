"""Partitions as a person types them in a form: `0, 3`, `0-3` or both (`0-3, 7`); empty: every partition.

PATTERN is what a form can check alone (the Airflow Params' `pattern`); parse_partitions also refuses what a
pattern cannot see, a range written backwards (`3-0`), and gives the numbers in order, each once."""
from __future__ import annotations

import re

from ledgerbatch.errors import LedgerbatchError

MAX_PARTITIONS = 100_000  # Kafka's own limit is far below: a typo such as 0-99999999 is refused, not expanded
_ITEM = r"\d+(\s*-\s*\d+)?"
PATTERN = rf"^\s*({_ITEM}(\s*,\s*{_ITEM})*)?\s*$"


def parse_partitions(text: str | None) -> tuple[int, ...] | None:
    """The partitions `text` names, sorted and each once; None where it names none (empty: every partition)."""
    if text is None or not text.strip():
        return None
    if not re.fullmatch(PATTERN, text):
        raise LedgerbatchError(f"partitions {text!r}: write partition numbers and ranges separated by commas, "
                               f"e.g. 0, 3 or 0-3")
    found: set[int] = set()
    for item in text.split(","):
        low, _, high = (part.strip() for part in item.partition("-"))
        first, last = int(low), int(high or low)
        if first > last:
            raise LedgerbatchError(f"partitions {text!r}: the range {first}-{last} runs backwards; write {last}-{first}")
        if last - first >= MAX_PARTITIONS:
            raise LedgerbatchError(f"partitions {text!r}: the range {first}-{last} names more than "
                                   f"{MAX_PARTITIONS} partitions")
        found.update(range(first, last + 1))
    return tuple(sorted(found))
