"""Times as users give them (ISO-8601) and as Kafka takes them (epoch milliseconds)."""
from __future__ import annotations

import datetime as dt

from ledgerbatch.errors import LedgerbatchError

SECONDS_PER = {"s": 1, "m": 60, "h": 3600, "d": 86400}  # the units of durations and ages: 90s, 5m, 1h, 30d


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


def before_time(value: str, now: dt.datetime | None = None) -> dt.datetime:
    """`--before`: an ISO-8601 time (UTC where it names no zone), or an age such as 30d, 12h or 90m (that long
    before `now`)."""
    text = (value or "").strip()
    if text[:-1].isdigit() and text[-1:] in SECONDS_PER:
        return (now or dt.datetime.now(dt.timezone.utc)) - dt.timedelta(seconds=int(text[:-1]) * SECONDS_PER[text[-1]])
    try:
        ts = dt.datetime.fromisoformat(text)
    except ValueError:
        raise LedgerbatchError(f"{value!r} is neither an ISO-8601 time nor an age such as 30d, 12h or 90m") from None
    return ts.replace(tzinfo=dt.timezone.utc) if ts.tzinfo is None else ts
