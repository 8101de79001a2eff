"""Times as users give them (ISO-8601) and as Kafka takes them (epoch milliseconds)."""
from __future__ import annotations

import datetime as dt

from ledgerbatch.errors import LedgerbatchError


def epoch_ms(value: str | None) -> int | None:
    """An ISO-8601 time (UTC where it names no zone) as epoch milliseconds."""
    if not value:
        return None
    try:
        ts = dt.datetime.fromisoformat(value)
    except (TypeError, ValueError):
        raise LedgerbatchError(f"{value!r} is not an ISO-8601 time") from None
    ts = ts.replace(tzinfo=dt.timezone.utc) if ts.tzinfo is None else ts
    return int(ts.timestamp() * 1000)
