import datetime as dt

import pytest

from ledgerbatch.errors import LedgerbatchError
from ledgerbatch.model.batch import BatchKind, RangeRefused, classify
from ledgerbatch.model.times import before_time

NOW = dt.datetime(2026, 11, 27, 12, 0, tzinfo=dt.timezone.utc)


def test_before_takes_an_age_or_an_iso_time():
    assert before_time("30d", NOW) == NOW - dt.timedelta(days=30)
    assert before_time("90m", NOW) == NOW - dt.timedelta(minutes=90)
    assert before_time("2026-11-01T00:00:00", NOW) == dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc)
    assert before_time("2026-11-01T00:00:00+01:00", NOW).utcoffset() == dt.timedelta(hours=1)
    for bad in ("", "30 days", "d", "yesterday"):
        with pytest.raises(LedgerbatchError, match="neither an ISO-8601 time nor an age"):
            before_time(bad, NOW)


def test_a_replay_before_the_horizon_is_refused_and_one_after_it_is_not():
    assert classify(10, 10, 20, 0, from_offset=10, horizon=10) == BatchKind.REPLAY
    with pytest.raises(RangeRefused, match="the replay horizon is 10: replay from 10 on"):
        classify(10, 10, 19, 0, from_offset=9, horizon=10)
    assert classify(0, 5, 5, 10, from_offset=0, horizon=10) == BatchKind.BACKFILL  # never delivered: no horizon
