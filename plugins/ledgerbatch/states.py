"""The ledger's typed states, and the pure rule that says what kind of batch a range may become."""
from __future__ import annotations

from enum import StrEnum

from .errors import LedgerbatchError


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


def classify(overlap: int, span: int, until_offset: int, start_offset: int | None) -> BatchKind:
    """REPLAY when committed batches delivered all of the range, BACKFILL when it lies wholly before
    the pipeline's start and nothing delivered it; anything else would duplicate or skip (pure)."""
    if start_offset is None:
        raise RangeRefused("the pipeline has not started on this partition: run it first")
    if overlap == span:
        return BatchKind.REPLAY
    if overlap == 0 and until_offset <= start_offset:
        return BatchKind.BACKFILL
    raise RangeRefused(f"the range is neither fully delivered (replay) nor fully before the pipeline's start offset "
                       f"{start_offset} (backfill); {overlap} of its {span} offsets were delivered")
