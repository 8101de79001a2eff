"""batch.max_bytes at planning: each planned range read once from Kafka to find where its values reach
the byte budget, so the recorded range is already the capped one (a resumed batch keeps it)."""
from __future__ import annotations

import logging

from ledgerbatch.errors import OFFSETS_LOST, DataLossError, UnavailableError
from ledgerbatch.model.ranges import OffsetRange, cut_at_bytes
from ledgerbatch.source.reader import RangeReadError, read_messages

log = logging.getLogger(__name__)
STALL_S = 60.0


def cap_bytes(ranges: list[OffsetRange], max_bytes: int, kafka_conf: dict) -> list[OffsetRange]:
    """Each range cut where its values would pass `max_bytes` (null values count 0 bytes). Brokers that stop
    answering during the read are an outage (UnavailableError: a follower waits, then plans again); offsets
    gone from the log are data loss."""
    out = []
    for rng in ranges:
        messages = read_messages(rng, kafka_conf, STALL_S)
        try:
            capped = cut_at_bytes(rng, ((r.offsets, [len(v) if v is not None else 0 for v in r.values])
                                        for r in messages), max_bytes)
        except RangeReadError as exc:
            if OFFSETS_LOST in str(exc):
                raise DataLossError(f"measuring batch.max_bytes: {exc}; nothing was planned. After checking, record "
                                    f"the loss with `ledgerbatch acknowledge-loss PIPELINE --by NAME`") from None
            if exc.retriable:
                raise UnavailableError(f"Kafka stopped answering while batch.max_bytes was measured: {exc}",
                                       "Kafka") from None
            raise
        finally:
            messages.close()  # stops the read, and closes its consumer, once the budget is reached
        if capped != rng:
            log.info("%s: batch.max_bytes %d reached, range ends at %d", rng, max_bytes, capped.until_offset)
        out.append(capped)
    return out
